"""django-q2 as the calendar: allow-listed schedule functions, run through
django-q2's own scheduler and worker code, that only create obligations."""

import queue
from datetime import timedelta
from multiprocessing import Value

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Schedule
from django_q.scheduler import scheduler
from django_q.signing import SignedPackage
from django_q.worker import worker

from jobs.models import Job
from tests.factories import TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

CALLED = []


def forbidden(*args, **kwargs):
    """Not a schedule function: must never run."""
    CALLED.append((args, kwargs))


@pytest.fixture(autouse=True)
def keep_the_test_connection(monkeypatch):
    # The scheduler recycles connections between runs; here that would close
    # the connection holding the test's transaction.
    import django_q.scheduler

    monkeypatch.setattr(django_q.scheduler, "close_old_django_connections", lambda: None)


def fire_due_schedules() -> list[dict]:
    """What `qcluster` does, in this process: the scheduler turns due
    schedules into signed tasks on the ORM broker; return them as the
    cluster's worker would receive them."""
    broker = get_broker()
    scheduler(broker=broker)
    tasks = []
    while batch := broker.dequeue():
        for ack_id, package in batch:
            tasks.append(SignedPackage.loads(package))
            broker.acknowledge(ack_id)
    return tasks


def execute(task: dict) -> dict:
    """Run one task with django-q2's worker loop (sync: errors propagate and
    the test's connection is not recycled)."""
    tasks, results = queue.Queue(), queue.Queue()
    tasks.put({**task, "sync": True})
    tasks.put("STOP")
    worker(tasks, results, Value("f", -1), timeout=None)
    return results.get_nowait()


def test_install_schedules_creates_the_defaults_once_and_keeps_a_retimed_one(capsys):
    call_command("install_schedules")
    assert set(Schedule.objects.values_list("name", flat=True)) == {
        "invoice-reminder-plan", "retention-sweep", "consistency-audit"}
    Schedule.objects.filter(name="retention-sweep").update(schedule_type=Schedule.WEEKLY)
    call_command("install_schedules")
    assert Schedule.objects.count() == 3
    assert Schedule.objects.get(name="retention-sweep").schedule_type == Schedule.WEEKLY
    assert "retention-sweep: exists" in capsys.readouterr().out


def test_a_late_and_repeated_trigger_of_the_invoice_plan_creates_one_obligation_per_tenant():
    TenantFactory(slug="studio")
    TenantFactory(slug="atelier")
    call_command("install_schedules")
    intended = timezone.now().replace(hour=0, minute=5, second=0, microsecond=0) - timedelta(days=1)
    # The cluster was down: the trigger fires hours after its time.
    Schedule.objects.filter(name="invoice-reminder-plan").update(next_run=intended)
    Schedule.objects.exclude(name="invoice-reminder-plan").update(next_run=timezone.now() + timedelta(days=1))

    [task] = fire_due_schedules()
    execute(task)
    execute(task)  # a redelivered trigger
    assert fire_due_schedules() == []  # catch_up=False: one trigger, not one per missed day

    day = intended.date().isoformat()
    jobs = Job.objects.filter(key=f"invoice-reminder-plan-{day}")
    assert sorted(jobs.values_list("tenant", flat=True)) == ["atelier", "studio"]
    assert {j.action for j in jobs} == {"company.plan_invoice_reminders"}
    assert {j.payload["date"] for j in jobs} == {day}
    assert Job.objects.count() == 2
    assert Schedule.objects.get(name="invoice-reminder-plan").next_run > timezone.now()


def test_a_schedule_naming_another_function_is_refused_on_save():
    with pytest.raises(ValidationError, match="not a schedule function"):
        Schedule.objects.create(name="evil", func="os.system", args="'id'")
    with pytest.raises(ValidationError, match="hooks are not allowed"):
        Schedule.objects.create(name="hooked", func="jobs.schedules.consistency_audit", hook="os.system")
    assert not Schedule.objects.exists()


def test_a_schedule_naming_another_function_is_refused_when_it_fires():
    call_command("install_schedules")
    # Smuggled past the save check (a raw UPDATE, an old row).
    Schedule.objects.filter(name="consistency-audit").update(
        func="tests.jobs.test_schedules.forbidden", hook="tests.jobs.test_schedules.forbidden",
        next_run=timezone.now() - timedelta(minutes=1))
    Schedule.objects.filter(name="retention-sweep").update(next_run=timezone.now() - timedelta(minutes=1))
    tasks = {task["group"]: task for task in fire_due_schedules()}
    refused = tasks["consistency-audit"]
    assert refused["func"] == "jobs.schedules.schedule_refused" and "hook" not in refused
    with pytest.raises(PermissionDenied, match="tests.jobs.test_schedules.forbidden"):
        execute(refused)
    assert CALLED == []
    # The refused row did not hold back the others fired in the same run.
    assert tasks["retention-sweep"]["func"] == "jobs.schedules.retention_sweep"
    assert execute(tasks["retention-sweep"])["success"] is True


def test_only_a_superuser_may_add_or_change_a_schedule_and_only_to_a_listed_function(client):
    call_command("install_schedules")
    schedule = Schedule.objects.get(name="retention-sweep")
    staff = UserFactory(username="ops", staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="django_q"))
    client.force_login(staff)
    assert client.get("/admin/django_q/schedule/add/").status_code == 403
    assert client.post("/admin/django_q/schedule/add/", {"name": "x", "func": "os.system"}).status_code == 403
    page = client.get(f"/admin/django_q/schedule/{schedule.pk}/change/")
    assert page.status_code == 200 and b'name="func"' not in page.content  # read only

    root = UserFactory(username="root", superuser=True)
    client.force_login(root)
    refused = client.post("/admin/django_q/schedule/add/", {
        "name": "evil", "func": "os.system", "schedule_type": "D", "repeats": -1,
        "next_run_0": "2030-01-01", "next_run_1": "00:00:00"})
    assert refused.status_code == 200 and b"os.system" in refused.content
    accepted = client.post("/admin/django_q/schedule/add/", {
        "name": "audit-again", "func": "jobs.schedules.consistency_audit", "schedule_type": "D", "repeats": -1,
        "next_run_0": "2030-01-01", "next_run_1": "00:00:00"})
    assert accepted.status_code == 302
    assert Schedule.objects.get(name="audit-again").intended_date_kwarg == "intended_date"


def test_an_edited_schedule_is_validated_again_and_a_save_that_keeps_its_function_is_not_refused():
    call_command("install_schedules")
    schedule = Schedule.objects.get(name="consistency-audit")
    schedule.func = "os.system"
    with pytest.raises(ValidationError, match="not a schedule function"):
        schedule.save()
    schedule = Schedule.objects.get(name="consistency-audit")
    schedule.hook = "os.system"
    with pytest.raises(ValidationError, match="hooks are not allowed"):
        schedule.save()
    assert Schedule.objects.filter(name="consistency-audit").values_list("func", "hook").get() == (
        "jobs.schedules.consistency_audit", None)

    # The scheduler saves each schedule it fires (next_run) in one transaction for all of them: a row
    # whose function did not change is not refused there (it is refused when it fires).
    Schedule.objects.filter(name="retention-sweep").update(func="tests.jobs.test_schedules.forbidden")
    smuggled = Schedule.objects.get(name="retention-sweep")
    smuggled.next_run = timezone.now() + timedelta(days=1)
    smuggled.save()


def test_a_superuser_saving_a_schedule_that_names_an_unlisted_function_is_refused_in_the_form(client):
    call_command("install_schedules")
    Schedule.objects.filter(name="retention-sweep").update(func="tests.jobs.test_schedules.forbidden")
    schedule = Schedule.objects.get(name="retention-sweep")
    client.force_login(UserFactory(username="root", superuser=True))
    refused = client.post(f"/admin/django_q/schedule/{schedule.pk}/change/", {
        "name": "retention-sweep", "func": "tests.jobs.test_schedules.forbidden", "schedule_type": "D",
        "repeats": -1, "next_run_0": "2031-01-01", "next_run_1": "00:00:00"})
    assert refused.status_code == 200
    assert b"is not a schedule function of this project" in refused.content
    assert Schedule.objects.get(pk=schedule.pk).next_run.year != 2031
