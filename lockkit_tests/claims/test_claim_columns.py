"""The row a claim returns with ``fetch=True``: each column once, and the instance as the database holds it."""

from __future__ import annotations

import pytest
from django.db import connections

from lockkit.claims import claim_next
from lockkit.claims.inputs import exact_pk
from lockkit.claims.sql import claims_sql_for
from lockkit_tests.models import CodeJob, Job
from lockkit_tests.support.vendors import vendor_params

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.mark.parametrize("alias", vendor_params())
def test_a_claimed_row_names_each_column_once_and_reads_as_a_queryset_would(alias: str) -> None:
    fields = Job._meta.concrete_fields
    statements = claims_sql_for(Job, alias)
    quote = connections[alias].ops.quote_name
    returned = statements.returning(fields)
    sources = [part.split(" AS ")[0] for part in returned.split(", ")]
    # Each column once (the key, the token, the worker, the attempts), but the lease: the claim's own is made
    # aware on MariaDB and SQLite, the field's is read as the database returned it.
    twice = {source for source in sources if sources.count(source) > 1}
    lease = f"{statements.table.name}.{quote(str(Job._meta.get_field('lease_expires_at').column))}"
    assert twice == {lease}, returned
    assert len(sources) == len(fields) + 1
    assert all(quote(str(field.column)) in returned for field in fields)
    Job.objects.using(alias).create(name="once", state="pending")
    ((job, claim),) = claim_next(
        Job.objects.using(alias).filter(name="once"), worker="w-once", lease=60, fetch=True
    )
    stored = Job.objects.using(alias).get(pk=job.pk)
    assert [getattr(job, f.attname) for f in fields] == [getattr(stored, f.attname) for f in fields]
    assert (job.pk, job.claim_token, job.claimed_by, job.attempts) == (claim.pk, claim.token, "w-once", 1)
    assert job.lease_expires_at == claim.lease_expires_at == stored.lease_expires_at


def test_a_key_checked_once_is_not_taken_for_another() -> None:
    """``exact_pk`` keeps the last key it accepted: another value, or the same for another model, is checked."""
    key = "code-1"
    assert exact_pk(CodeJob, key, "claim.pk") == key
    assert exact_pk(CodeJob, key, "claim.pk") == key
    with pytest.raises(ValueError, match=r"claim\.pk"):
        exact_pk(CodeJob, "x" * 13, "claim.pk")  # longer than the column
    with pytest.raises(ValueError, match=r"claim\.pk"):
        exact_pk(Job, key, "claim.pk")  # the same object, but Job's key is an integer
    assert exact_pk(Job, 7, "claim.pk") == 7
    with pytest.raises(ValueError, match=r"claim\.pk"):
        exact_pk(CodeJob, key * 3, "claim.pk")
