from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Each app's `handlers` module registers its actions with @action.
        autodiscover_modules("handlers")
        # Register the relay and the timer sweep as the worker's periodic
        # tasks, and the inbound built-ins, in every process; the Django tasks
        # runner and the audit's action; the django-q2 allow-list guard.
        from . import audit, inbound, outbox, schedules, tasks_backend, timers  # noqa: F401
        # Review deadlines plan and end with every move into and out of
        # review; their escalation action is registered with the others.
        from . import review_due, review_escalation  # noqa: F401
