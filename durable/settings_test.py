"""Settings for the test suite: the real settings plus a test-only subject app."""

import os
import tempfile
from pathlib import Path

from .settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.engineapp"]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast users in tests

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and not os.environ.get(  # noqa: F405
    "SQLITE_TEST_DATABASE"
):
    # Outside the project folder, and one per test run (the process id), so
    # two checkouts — or two runs of one — never share or leave a file there.
    # SQLITE_TEST_DATABASE still names a file of your choice.
    DATABASES["default"]["TEST"]["NAME"] = str(  # noqa: F405
        Path(tempfile.gettempdir()) / f"durable-test-{os.getpid()}.sqlite3"
    )
