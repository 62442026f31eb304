from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Operations take part in the engine's retention sweep, consistency
        # audit and metrics (the engine never imports this app).
        from . import audit, metrics, retention  # noqa: F401
