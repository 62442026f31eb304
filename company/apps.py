from django.apps import AppConfig


class CompanyConfig(AppConfig):
    name = "company"
    default_auto_field = "django.db.models.BigAutoField"
