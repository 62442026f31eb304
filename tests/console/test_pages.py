"""Console pages: roles from the migration, the tenant scope on every list,
queues, the evidence timeline (bounded at 100,000 events), health on the
admin index and in `queue_health`, and static files with DEBUG off."""

import json

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job, JobEvent
from operations.models import Operation
from tests.factories import MembershipFactory, OperationFactory, UserFactory

from .conftest import make_job

pytestmark = pytest.mark.django_db


def test_the_migration_creates_least_privilege_groups():
    perms = {g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()}
             for g in Group.objects.all()}
    assert "jobs.review_job" in perms["reviewers"] and "jobs.operate_job" not in perms["reviewers"]
    assert "operations.decide_operation" not in perms["reviewers"]
    assert {"jobs.operate_job", "operations.decide_operation"} <= perms["operators"]
    assert "jobs.review_job" not in perms["operators"]
    assert not {p for p in perms["viewers"] if not p.split(".")[1].startswith("view_")}
    assert {"jobs.view_job", "operations.view_operation", "operations.view_receipt"} <= perms["viewers"]


def test_every_list_shows_only_the_users_tenants(client, people):
    mine = make_job("mine-1", "NEEDS_ATTENTION")
    theirs = make_job("theirs-1", "NEEDS_ATTENTION", tenant="acme")
    for job in (mine, theirs):
        OperationFactory(job=job, provider="sim-bare", request={"to": f"{job.key}@example.com"}, state="UNKNOWN")
    client.force_login(people["operator"])
    for url in ("/admin/jobs/job/", "/admin/operations/operation/", "/admin/console/attention/",
                "/admin/jobs/job/?q=theirs", "/admin/jobs/job/?tenant=acme"):
        page = client.get(url).content.decode()
        assert "theirs-1" not in page, url
    assert "mine-1" in client.get("/admin/jobs/job/").content.decode()
    op = Operation.objects.get(job=theirs)
    assert client.get(f"/admin/operations/operation/{op.pk}/change/").status_code == 404
    assert client.get(f"/admin/operations/operation/{op.pk}/decide/").status_code == 404
    # The tenant filter lists the user's tenants from the Tenant table.
    listing = client.get("/admin/jobs/job/").content.decode()
    assert "?tenant=studio" in listing and "?tenant=acme" not in listing


def test_staff_without_view_permission_cannot_open_operations_by_url(client, people):
    job = make_job("q-1", "NEEDS_ATTENTION")
    op = OperationFactory(job=job, provider="sim-bare", request={}, state="UNKNOWN")
    bare = UserFactory(username="bare", staff=True)
    MembershipFactory(user=bare, tenant=people["viewer"].memberships.get().tenant, role="viewer")
    client.force_login(bare)
    assert client.get(f"/admin/operations/operation/{op.pk}/change/").status_code == 403
    assert client.get("/admin/operations/receipt/").status_code == 403


def test_review_queue_is_oldest_first_and_filters_by_action_and_reason(client, people):
    first = make_job("old-1", "WAITING_REVIEW")
    make_job("new-1", "WAITING_REVIEW", action="connectors.send_email")
    Job.objects.filter(pk=first.pk).update(updated_at=timezone.now() - timezone.timedelta(hours=1))
    client.force_login(people["reviewer"])
    page = client.get("/admin/console/review/").content.decode()
    assert page.index("old-1") < page.index("new-1")
    only = client.get("/admin/console/review/?action=connectors.send_email").content.decode()
    assert "new-1" in only and "old-1" not in only
    assert "old-1" not in client.get("/admin/console/review/?reason=nothing-like-this").content.decode()


def test_the_decision_page_shows_the_proposal_and_its_rationale(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email",
                   payload={"to": "ana@example.com", "subject": "Quote 17", "body": "Dear Ana,\nhere it is."})
    JobEvent.objects.filter(job=job, kind="enqueue").update(
        actor="agent:rules", reason="the customer asked twice",
        detail={"proposal": {"id": 7, "proposed_by": "agent:rules", "rationale": "the customer asked twice",
                             "subject_type": "quote", "subject_id": "17", "subject_version": 2}})
    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "Proposed by <strong>agent:rules</strong> — the customer asked twice" in page
    assert "Dear Ana,\nhere it is." in page and "ana@example.com" in page


def _bulk_events(job, n):
    now = timezone.now()
    JobEvent.objects.bulk_create(
        [JobEvent(job=job, kind="renew", from_state="LEASED", to_state="LEASED", epoch=i, created_at=now,
                  reason=f"event {i}") for i in range(n)], batch_size=5000)


def test_a_job_with_100000_events_opens_with_bounded_queries_and_rows(client, people):
    job = make_job("long-1", "WAITING_REVIEW")
    _bulk_events(job, 100_000)
    client.force_login(people["reviewer"])
    for url in (f"/admin/console/jobs/{job.pk}/", f"/admin/console/jobs/{job.pk}/timeline/",
                f"/admin/jobs/job/{job.pk}/change/"):
        with CaptureQueriesContext(connection) as queries:
            page = client.get(url)
        assert page.status_code == 200
        assert len(queries) <= 25, (url, len(queries))
        for query in queries:
            sql = query["sql"]
            if "jobs_jobevent" in sql and sql.lstrip().upper().startswith("SELECT"):
                # Every read of the history is bounded: LIMIT, never the whole table.
                assert "LIMIT" in sql.upper(), (url, sql)
    timeline = client.get(f"/admin/console/jobs/{job.pk}/timeline/").content.decode()
    assert timeline.count("<tr class=\"timeline-") == 50 and "event 99999" in timeline and "Older" in timeline


def test_the_timeline_pages_back_to_the_beginning_and_downloads_everything(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    _bulk_events(job, 120)
    client.force_login(people["viewer"])
    seen, url = [], f"/admin/console/jobs/{job.pk}/timeline/"
    while url:
        response = client.get(url)
        html = response.content.decode()
        seen += [line for line in html.splitlines() if "timeline-" in line and "<tr" in line]
        older = response.context["older"]
        url = f"/admin/console/jobs/{job.pk}/timeline/?before={older}" if older else None
    # Every history row, and the claim of each attempt a row ended (a claim
    # is shown at its time from the row that ended its attempt).
    events = JobEvent.objects.filter(job=job)
    assert len(seen) == events.count() + events.exclude(claimed_at=None).count()

    download = client.get(f"/admin/console/jobs/{job.pk}/history.json")
    history = json.loads(b"".join(download.streaming_content))
    assert len(history["events"]) == JobEvent.objects.filter(job=job).count()
    assert history["job"]["key"] == "q-1"


def test_health_on_the_index_and_queue_health_report_the_same_figures(client, people, capsys):
    make_job("r-1", "WAITING_REVIEW")
    make_job("a-1", "NEEDS_ATTENTION")
    make_job("a-2", "NEEDS_ATTENTION", tenant="acme")
    client.force_login(people["operator"])
    index = client.get("/admin/").content.decode()
    assert "Queue health" in index and "/admin/console/review/" in index
    health = client.get("/admin/").context["h"]
    assert (health.job_health.waiting_review, health.job_health.needs_attention) == (1, 1)  # studio only

    call_command("queue_health", "--json")
    printed = json.loads(capsys.readouterr().out)
    assert printed["job_health"]["waiting_review"] == 1 and printed["job_health"]["needs_attention"] == 2
    assert "1 job(s) waiting for review" in printed["problems"] and "2 job(s) need attention" in printed["problems"]
    with pytest.raises(SystemExit):
        call_command("queue_health", "--check")


def test_admin_stylesheet_is_served_with_debug_off(client, settings):
    settings.DEBUG = False
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert b"body" in b"".join(response.streaming_content)


def test_the_jobs_list_never_counts_the_whole_table_nor_runs_distinct(admin_client, tenants, monkeypatch):
    from jobs import admin_scope

    for i in range(3):
        make_job(f"q-{i}", "READY")
    if connection.vendor == "postgresql":
        # Pretend the table is big: the planner's estimate replaces COUNT(*).
        monkeypatch.setattr(admin_scope, "EXACT_COUNT_BELOW", 0)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_job")
    for url in ("/admin/jobs/job/", "/admin/jobs/job/?state__exact=READY&tenant=studio", "/admin/jobs/job/?q=q-"):
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(url)
        assert page.status_code == 200 and "q-1" in page.content.decode()
        sql = [q["sql"].upper() for q in queries if "JOBS_JOB" in q["sql"].upper()]
        assert not [q for q in sql if "DISTINCT" in q], url
        counts = [q for q in sql if "COUNT(" in q]
        if connection.vendor == "postgresql":
            assert not counts, (url, counts)
            assert "about " in page.content.decode()  # says it is an estimate
        else:
            assert len(counts) <= 1, url  # the filtered result only, never a second full count


def test_the_job_admin_page_links_to_the_consoles_pages_that_apply(client, people):
    waiting, done = make_job("q-1", "WAITING_REVIEW"), make_job("q-2", "DONE")
    client.force_login(people["viewer"])
    page = client.get(f"/admin/jobs/job/{waiting.pk}/change/").content.decode()
    assert f'href="/admin/console/jobs/{waiting.pk}/timeline/">Evidence timeline' in page
    assert f'href="/admin/console/jobs/{waiting.pk}/">Decision page' in page
    page = client.get(f"/admin/jobs/job/{done.pk}/change/").content.decode()
    assert f'href="/admin/console/jobs/{done.pk}/timeline/">Evidence timeline' in page
    assert "Decision page" not in page


def test_the_site_root_opens_the_console(client):
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/admin/")
    assert client.get("/", follow=True).redirect_chain[-1][0].startswith("/admin/login/")


def test_the_timeline_shows_each_attempts_claim_with_its_worker_epoch_and_end_and_the_running_one(client, people):
    """A claim writes no history row: the timeline reads it from the row that
    ended the attempt, and the running attempt's from the job row."""
    from jobs.store import Store

    store = Store()
    store.enqueue("studio", "twice")
    first = store.claim("studio", "twice", "w-old", now=1_000, ttl=30)
    second = store.claim("studio", "twice", "w-new", now=1_040, ttl=3_000_000_000)  # the first lease ran out
    job = Job.objects.get(key="twice")
    client.force_login(people["viewer"])
    html = client.get(f"/admin/console/jobs/{job.pk}/timeline/").content.decode()
    # w-old's attempt (epoch 1): claimed, then ended by w-new's takeover.
    assert f"claim: → LEASED (epoch {first})" in html and "attempt 1 by w-old; ended by takeover" in html
    assert "takeover: LEASED → LEASED (epoch 1)" in html
    # w-new's attempt (epoch 2) is running: the job row says so.
    assert f"claim: → LEASED (epoch {second})" in html and "attempt 2 by w-new; running" in html
    store.finish("studio", "twice", "w-new", second, now=1_050)
    html = client.get(f"/admin/console/jobs/{job.pk}/timeline/").content.decode()
    assert "attempt 2 by w-new; ended by finish" in html and "running" not in html
    history = json.loads(b"".join(client.get(f"/admin/console/jobs/{job.pk}/history.json").streaming_content))
    assert [(e["kind"], e["worker_id"], e["epoch"], e["claimed_at"] is not None) for e in history["events"]] == [
        ("enqueue", "", 0, False), ("takeover", "w-old", 1, True), ("finish", "w-new", 2, True)]
