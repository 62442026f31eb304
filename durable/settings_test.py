"""Settings for the test suite: the real settings plus a test-only subject app."""

from .settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.engineapp"]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast users in tests
