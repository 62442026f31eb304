"""django-tasks' own test suite, adapted to `DurableBackend` and `run_worker`.

The cases follow the test suites of django-tasks 0.12.0 (`tests/tests/test_tasks.py`, the task API) and
django-tasks-db 0.12.0 (`tests/tests.py`: the database backend, its worker and worker processes), both
by Jake Howard and contributors, BSD-3-Clause (https://github.com/RealOrangeOne/django-tasks,
https://github.com/RealOrangeOne/django-tasks-db). Each test keeps the upstream test's name and what it
asserts; the code is written here for this project's backend: the backend is `DurableBackend`, the worker
is a real `manage.py run_worker` process (not `db_worker`), and rows are read through the engine's models.
Where upstream asserts something this backend deliberately does differently, the test asserts our
behaviour and docs/howto/django-tasks.md ("Where it differs from django-tasks' database backend") says
why; upstream cases that test only another backend's internals (its model, its command-line flags, its id
function option) are left out and listed there too.
"""
