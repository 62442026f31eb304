"""`make demo` runs `manage.py demo`: the company story must work end to end
(real simulator and worker processes, a SIGKILL after acceptance), with and
without serving the admin; it streams as it happens, installs the calendar's
schedules, and ends with what to do next."""

import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django_q.models import Schedule

from gateway.services import agent_from_key
from company.models import Membership, Quote
from durable.net import free_port
from jobs.models import Job, JobEvent
from review.decisions import job_approve
from tests.console.conftest import ensure_roles
from tests.support import ProcessOutput, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db(transaction=True)
def test_demo_story_sends_each_email_once_and_tells_what_happened(manage, tmp_path):
    User = get_user_model()
    User.objects.create_user(username="reviewer", password="my-own-password")
    manage.env = {**manage.env, "DEMO_SERVE": "0", "DEMO_STATE_DIR": str(tmp_path / "demo-state")}
    out = manage.run("demo", "--tenant", "story", timeout=240).stdout

    assert "demo-worker-1 was killed with SIGKILL before the answer reached it" in out
    assert "resumed: its worker died holding it" in out and "reconciled by lookup instead of sending blind" in out
    for number, status in (("Q-0001", "ACCEPTED"), ("Q-0002", "SENT"), ("Q-0003", "DECLINED")):
        assert f"{number} to " in out and f": {status}; emails at the provider: 1; receipt: lookup" in out
    assert dict(Quote.objects.values_list("number", "status")) == {
        "Q-0001": "ACCEPTED", "Q-0002": "SENT", "Q-0003": "DECLINED"}
    assert "INV-0002" in out and "reminder cancelled: invoice INV-0002 is paid" in out
    assert "reminder cancelled: edsger@example.com suppressed reminders (disputes the invoice)" in out
    assert "INV-0004" in out and "reminder re-planned (the invoice changed)" in out
    assert "INV-0005" in out and "reminded once (receipt lookup)" in out
    assert "quote-follow-up-Q-0002: proposed by timer:quote-follow-up" in out
    assert "invoice-reminder-INV-0001: proposed by agent:rules" in out
    assert "proposed 1 new;" in out and "proposed 0 new" in out
    assert "the provider holds 4 message(s); most for one operation: 1" in out
    # Why INV-0001's reminder is both planned and waiting for a reviewer.
    inv1 = next(line for line in out.splitlines() if line.startswith("  INV-0001"))
    assert "its reminder was planned for" in inv1 and "but agent:rules proposed reminding it now" in inv1
    assert "the reminder job waits for a reviewer (WAITING_REVIEW)" in inv1
    assert "approved, one reminder goes out at once" in inv1
    # The calendar's schedules, and what to do next (serving comes first: DEMO_SERVE=0 serves nothing).
    assert "calendar (django-q2, `install_schedules`): created invoice-reminder-plan" in out
    assert set(Schedule.objects.values_list("name", flat=True)) == set(settings.DURABLE_SCHEDULES)
    next_steps = out[out.index("What to do next"):]
    assert "1. serve the admin: run the demo again without DEMO_SERVE=0" in next_steps
    assert "as 'reviewer' (an existing user the demo left unchanged: your password)" in next_steps
    review = Job.objects.get(tenant="story", key="invoice-reminder-INV-0001")
    assert f"approve invoice-reminder-INV-0001 at http://127.0.0.1:8000/admin/console/jobs/{review.pk}/" in next_steps
    assert "manage.py run_worker" not in next_steps  # no simulator outlives a DEMO_SERVE=0 run
    # A usable agent key: alone on the last line, and in the file the demo names.
    key = out.strip().splitlines()[-1]
    key_file = tmp_path / "demo-state" / "demo-agent-key"
    assert key_file.read_text().strip() == key and str(key_file) in next_steps
    assert agent_from_key(key).name == "demo-agent"
    # An outside agent proposes over HTTP, a reviewer decides, its endpoint gets the signed callbacks.
    assert "POST http://127.0.0.1:" in out and "→ 201: outside-agent-hello-1 is WAITING_REVIEW" in out
    assert "the same POST again → 200, created: False" in out
    assert "rejected it in the console's decision service" in out
    for event in ("proposal.decided", "proposal.cancelled"):
        assert f"the agent's endpoint received {event}" in out
    assert "signature WRONG" not in out and "Idempotency-Key = event id: True" in out
    assert "CANCELLED, decision reject by admin" in out

    # An existing user is never changed; the others get their memberships (C4).
    reviewer = User.objects.get(username="reviewer")
    assert reviewer.check_password("my-own-password") and not reviewer.memberships.exists()
    assert "reviewer (existed, left unchanged)" in out
    assert Membership.objects.get(user__username="operator", tenant__slug="story").role == "operator"
    assert User.objects.get(username="admin").is_superuser

    # A second run on the same database tells the same story from the records.
    again = manage.run("demo", "--tenant", "story", timeout=240).stdout
    assert "told the story before" in again
    assert "the provider holds 4 message(s); most for one operation: 1" in again
    assert "already installed: invoice-reminder-plan, retention-sweep, consistency-audit" in again
    assert Schedule.objects.count() == len(settings.DURABLE_SCHEDULES)


@pytest.mark.django_db(transaction=True)
def test_the_served_demo_streams_its_story_and_says_who_approves_what_where(manage, tmp_path):
    # Written into a pipe, as `make demo | tee log` does — without the
    # PYTHONUNBUFFERED the other tests give their processes.
    # (Served whatever the caller's environment says: `DEMO_SERVE=0 make demo test`.)
    manage.env = {**{k: v for k, v in manage.env.items() if k != "PYTHONUNBUFFERED"},
                  "DEMO_STATE_DIR": str(tmp_path / "demo-state"), "DEMO_SERVE": "1"}
    ensure_roles()  # the groups of the migrations (a transactional test before this one flushed them)
    port = free_port()
    demo = manage.start("demo", "--tenant", "story", "--port", str(port))
    out = ProcessOutput(demo)
    try:
        # Each part of the story arrives while the demo is still running.
        out.wait_for("1. seeded tenant 'story'", timeout=240)
        out.wait_for("What to do next", timeout=240)
        out.wait_for(f"Admin: http://127.0.0.1:{port}/admin/", timeout=240)
        assert demo.poll() is None
        base = f"http://127.0.0.1:{port}"

        # `/` opens the console (the admin's login first).
        def root():
            try:
                urllib.request.build_opener(NoRedirect).open(f"{base}/", timeout=5)
            except urllib.error.HTTPError as answer:
                return answer
            except OSError:
                return None  # the server is still starting
        answer = wait_for(root, timeout=60, what="the demo's server")
        assert (answer.code, answer.headers["Location"]) == (302, "/admin/")
        # The production server (durable.asgi): the console's static files and MCP at /mcp.
        with urllib.request.urlopen(f"{base}/static/admin/css/base.css", timeout=5) as css:
            assert css.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{base}/mcp", data=b"{}", method="POST"), timeout=5)
        assert refused.value.code == 401  # no agent key

        text = out.text()
        assert f"log in at {base}/admin/ as 'reviewer' with the password 'demo-password'" in text
        reminder = Job.objects.get(tenant="story", key="invoice-reminder-INV-0001")
        follow_up = Job.objects.get(tenant="story", key="quote-follow-up-Q-0002")
        for job in (reminder, follow_up):
            assert f"approve {job.key} at {base}/admin/console/jobs/{job.pk}/" in text

        # The second terminal's worker: the demo's simulator and provider.
        simulator = re.search(r"provider simulator at (http://\S+)", text).group(1)
        command = next(line.strip() for line in text.splitlines() if "manage.py run_worker" in line)
        assert f"PROVIDER_URL={simulator}" in command
        assert "OPERATIONS_DEFAULT_EMAIL_PROVIDER=sim-lookup" in command
        assert f"DATABASE_URL={manage.env['DATABASE_URL']}" in command
        extra = subprocess.run(f"{command} --until-idle", shell=True, cwd=ROOT, capture_output=True, text=True,
                               timeout=120, env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"})
        assert extra.returncode == 0, extra.stdout + extra.stderr

        # Doing what it says: the reviewer approves the reminder, and it goes out once.
        newest = JobEvent.objects.filter(job=reminder).order_by("-id").values_list("id", flat=True).first()
        job_approve(job_id=reminder.pk, user=get_user_model().objects.get(username="reviewer"),
                    note="overdue, remind now", seen_event=newest)
        done = wait_for(lambda: Job.objects.filter(pk=reminder.pk, state="DONE").first(), timeout=120,
                        what="the approved reminder to be sent")
        assert done.result["sent"] is True
    finally:
        demo.send_signal(signal.SIGTERM)
        rest = out.finish(timeout=60)
    assert "stopping the worker, the simulator and the server" in rest


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.mark.django_db(transaction=True)
def test_demo_refuses_to_run_in_production(manage):
    # A complete production configuration, so it is the demo that refuses.
    manage.env = {**manage.env, "DURABLE_PRODUCTION": "1", "SECRET_KEY": "x" * 50, "DEMO_SERVE": "0",
                  "PROVIDER_API_KEY": "live-key", "PROVIDER_URL": "https://mail.example.com"}
    result = manage.run("demo", check=False, timeout=120)
    assert result.returncode != 0
    assert "refuses to run with DURABLE_PRODUCTION=1" in result.stderr
    assert not get_user_model().objects.exists()
