"""Console pages, under /admin/console/ and behind the admin's login
(`admin.site.admin_view`: staff only, CSRF-protected, never cached)."""

from django.contrib import admin
from django.urls import path

from . import queues, timer_views, views

app_name = "console"


def _view(function):
    return admin.site.admin_view(function)


urlpatterns = [
    path("review/", _view(queues.review_queue), name="review"),
    path("review/bulk/", _view(queues.review_bulk), name="review-bulk"),
    path("attention/", _view(queues.attention_queue), name="attention"),
    path("attention/bulk/", _view(queues.attention_bulk), name="attention-bulk"),
    path("batches/<int:batch_id>/", _view(queues.batch_page), name="batch"),
    path("jobs/<int:job_id>/assign/", _view(queues.assign), name="assign"),
    path("jobs/<int:job_id>/unassign/", _view(queues.unassign), name="unassign"),
    path("jobs/<int:job_id>/", _view(views.decision_page), name="decide"),
    path("jobs/<int:job_id>/decide/<slug:decision>/", _view(views.decide), name="decision"),
    path("jobs/<int:job_id>/timeline/", _view(views.timeline), name="timeline"),
    path("jobs/<int:job_id>/history.json", _view(views.timeline_download), name="timeline-json"),
    path("jobs/<int:job_id>/timers/<int:timer_id>/run/", _view(timer_views.timer_run_now), name="timer-run"),
    path("jobs/<int:job_id>/timers/<int:timer_id>/reschedule/", _view(timer_views.timer_reschedule),
         name="timer-reschedule"),
    path("jobs/<int:job_id>/cancel-wait/", _view(timer_views.wait_cancel), name="wait-cancel"),
]
