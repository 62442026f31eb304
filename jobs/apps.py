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
        # A web request or a calendar task that meets a prepared statement a
        # transaction pooler moved says which setting is wrong (jobs.pooling).
        from django.core.signals import got_request_exception
        from django.db.backends.signals import connection_created
        from django_q.signals import post_execute_in_worker

        from . import pooling

        # Each new connection runs without JIT (DATABASE_JIT).
        connection_created.connect(pooling.on_connection_created, dispatch_uid="jobs.pooling.jit")

        got_request_exception.connect(pooling.on_request_exception, dispatch_uid="jobs.pooling.web")
        post_execute_in_worker.connect(pooling.on_task_executed, dispatch_uid="jobs.pooling.qcluster")
