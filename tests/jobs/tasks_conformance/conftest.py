"""The backends the conformance suite runs against (upstream configures its own in each test case).

`default` is the durable backend, with one attempt per task (`MAX_ATTEMPTS: 1`): django-tasks' database
backend runs a task once and records its failure; the engine's retries are tested in
tests/jobs/test_tasks_backend.py. `second` is another durable backend (another tenant prefix), for
what upstream tests with a second alias; `immediate` and `missing` are upstream's."""

import pytest

CONFORMANCE_TASKS = {
    "default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": ["default", "queue-1"],
                "OPTIONS": {"MAX_ATTEMPTS": 1}},
    "second": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": [],
               "OPTIONS": {"MAX_ATTEMPTS": 1, "TENANT_PREFIX": "second:"}},
    "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
    "missing": {"BACKEND": "does.not.exist"},
}


@pytest.fixture(autouse=True)
def conformance_backends(settings):
    settings.TASKS = CONFORMANCE_TASKS
