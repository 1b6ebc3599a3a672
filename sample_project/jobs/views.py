"""Jobs JSON endpoints; each owns its short transactions (``non_atomic_requests``)."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from sample_project.api import json_errors, parse_body
from sample_project.jobs.bodies import CompleteBody, CreateJobBody, WorkerBody
from sample_project.jobs.models import Job
from sample_project.jobs.services import claim_job, claim_next_job, claim_reported, complete_job, enqueue


@require_POST
@transaction.non_atomic_requests
@json_errors
def create(request: HttpRequest) -> JsonResponse:
    """``POST /jobs/`` ``{"name", "payload"?}``: 201 ``{"id"}``."""
    body = parse_body(request, CreateJobBody)
    job = enqueue(body.name, body.payload)
    return JsonResponse({"id": job.pk}, status=201)


@require_GET
@transaction.non_atomic_requests
@json_errors
def detail(request: HttpRequest, job_id: int) -> JsonResponse:
    """``GET /jobs/<id>``: the job's state, worker and claim token."""
    job = Job.objects.get(pk=job_id)
    return JsonResponse(
        {"id": job.pk, "state": job.state, "worker": job.claimed_by, "token": job.claim_token}
    )


@require_POST
@transaction.non_atomic_requests
@json_errors
def claim(request: HttpRequest, job_id: int) -> JsonResponse:
    """``POST /jobs/<id>/claim`` ``{"worker"}``: 200 ``{"claimed": true}``, or 409 ``{"claimed": false}``."""
    claimed = claim_job(job_id, parse_body(request, WorkerBody).worker)
    return JsonResponse({"claimed": claimed}, status=200 if claimed else 409)


@require_POST
@transaction.non_atomic_requests
@json_errors
def claim_next(request: HttpRequest) -> HttpResponse:
    """``POST /jobs/claim-next`` ``{"worker"}``: 200 ``{"id", "token"}``, or 204 when no job is pending."""
    found = claim_next_job(parse_body(request, WorkerBody).worker)
    if found is None:
        return HttpResponse(status=204)
    return JsonResponse({"id": found.pk, "token": found.token})


@require_POST
@transaction.non_atomic_requests
@json_errors
def complete(request: HttpRequest, job_id: int) -> JsonResponse:
    """``POST /jobs/<id>/complete`` ``{"worker", "token", "result"?}``: 200, or 409 ``stale_claim``."""
    body = parse_body(request, CompleteBody)
    claim = claim_reported(job_id, body.worker, body.token)
    if claim is not None and complete_job(claim, body.result):
        return JsonResponse({"completed": True})
    return JsonResponse({"completed": False, "error": "stale_claim"}, status=409)
