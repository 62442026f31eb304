from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The review console (DESIGN §1, §14): queues, decision pages, the
    evidence timeline and queue health, inside the Django admin. Depends on
    `operations` and `jobs`; nothing depends on it."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"
