from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The review console (DESIGN §1, §14): queues, decision pages, the
    evidence timeline and queue health, inside the Django admin. Depends on
    `operations`, `review` and `jobs`; nothing depends on it."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The console's pages about a job, linked from the job's admin page
        # (the job admin offers the hook; it names no console URL).
        from django.urls import reverse

        from jobs.access import ATTENTION_QUEUE, REVIEW_QUEUE
        from review.admin import register_job_link

        register_job_link("Evidence timeline", lambda job: reverse("console:timeline", args=[job.pk]))
        register_job_link("Decision page", lambda job: reverse("console:decide", args=[job.pk])
                          if job.state in (REVIEW_QUEUE, ATTENTION_QUEUE) else "")
