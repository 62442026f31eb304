from django.apps import AppConfig


class ProvingConfig(AppConfig):
    """What measures the system: the benchmark (`manage.py bench`) and the
    chaos run (`manage.py chaos`), with the benchmark's own no-op action
    and the gateway bench's reference row (`BenchRow`). Depends on `jobs`,
    `operations` and `connectors`; nothing depends on it."""

    name = "proving"
    default_auto_field = "django.db.models.BigAutoField"
