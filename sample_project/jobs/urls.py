from __future__ import annotations

from django.urls import path

from sample_project.jobs import views

app_name = "jobs"
urlpatterns = [
    path("", views.create, name="create"),
    path("claim-next", views.claim_next, name="claim-next"),
    path("<int:job_id>", views.detail, name="detail"),
    path("<int:job_id>/claim", views.claim, name="claim"),
    path("<int:job_id>/complete", views.complete, name="complete"),
]
