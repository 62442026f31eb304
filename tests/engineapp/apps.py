from django.apps import AppConfig


class EngineappConfig(AppConfig):
    """Test-only actions for worker runtime tests."""

    name = "tests.engineapp"
    label = "engineapp"
