"""Reads on a real standby (DATABASE_REPLICA_URL, durable.replica): a
private primary and its streaming standby (proving.clusters), the standby's
replay paused so it is behind. A page and an API answer read there show
what the standby holds and say how far behind it is; sessions, an agent's
key and tenant, writes, reads inside a transaction and reads outside a
read-only request use the primary."""

import json

import pytest

from proving.clusters import PrivateClusters, postgres_binaries_available
from proving.processes import manage

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not postgres_binaries_available(), reason="needs PostgreSQL's server binaries (POSTGRES_BIN)"),
]

SCRIPT = """
import json, re, time
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.test import Client
from company.models import Tenant
from durable.replica import reads_on_replica
from gateway.services import agent_create, agent_key_issue
from jobs.models import Job, JobEvent
from jobs.store import Store
from review.decisions import job_reject

out = {}
root = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-enough-password-1")
store = Store()
store.enqueue("replica", "to-review")
store.fail("replica", "to-review", "w1", store.claim("replica", "to-review", "w1"), error="bad address",
           failure="permanent")
reviewed = Job.objects.get(key="to-review")
# An agent proposes before the pause (an agent reads only its own proposals).
tenant = Tenant.objects.create(slug="replica", name="Replica")
agent, issued = agent_create(tenant=tenant, name="reader", actor="test")
client = Client()
email = {"to": "ada@example.com", "subject": "Your quote", "body": "Attached."}


def propose(key, api_key):
    return client.post("/api/v1/proposals", json.dumps({"action": "connectors.send_email", "key": key,
                       "rationale": "asked", "payload": email}), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {api_key}").status_code


out["proposed"] = [propose("proposed-before-the-pause", issued.key)]
store.enqueue("replica", "seen-before-the-pause")
deadline = time.monotonic() + 30
while True:
    with reads_on_replica():
        if Job.objects.filter(key="seen-before-the-pause").exists():
            break
    assert time.monotonic() < deadline, "the standby never replayed the first job"
    time.sleep(0.05)
with connections["replica"].cursor() as cursor:
    cursor.execute("SELECT pg_wal_replay_pause()")
Store().enqueue("replica", "written-after-the-pause")
# Someone else decides the job on the primary; the standby does not know yet.
newest = JobEvent.objects.filter(job=reviewed).order_by("-id").values_list("id", flat=True).first()
job_reject(job_id=reviewed.pk, user=root, note="someone else was first", seen_event=newest)
time.sleep(1.2)  # the standby's last replayed commit is now over a second old

client.force_login(root)  # the session is written, then read, on the primary
page = client.get("/admin/jobs/job/")
html = page.content.decode()
out["page"] = page.status_code
out["page_shows"] = [key for key in ("seen-before-the-pause", "written-after-the-pause") if key in html]
out["page_says_behind"] = 'id="replica-lag"' in html
# The decision page read on the standby still offers the decision; taken
# from it, the decision is checked on the primary against the event the
# page showed, and refused.
page = client.get(f"/admin/console/jobs/{reviewed.pk}/").content.decode()
out["stale_page_offers_approve"] = "/decide/approve/" in page
out["decision_page_says_behind"] = 'id="replica-lag"' in page
seen = re.search(r'name="seen_event" value="(\\d+)"', page).group(1)
taken = client.post(f"/admin/console/jobs/{reviewed.pk}/decide/approve/", {"note": "looks fine", "seen_event": seen})
out["stale_decision"] = [taken.status_code, Job.objects.get(pk=reviewed.pk).state]

# A key issued after the pause: who may ask is decided on the primary, what
# the agent reads comes from the standby.
fresh = agent_key_issue(agent=agent, actor="test")
out["proposed"].append(propose("proposed-after-the-pause", fresh.key))
bearer = {"HTTP_AUTHORIZATION": f"Bearer {fresh.key}"}
before = client.get("/api/v1/proposals/proposed-before-the-pause", **bearer)
after = client.get("/api/v1/proposals/proposed-after-the-pause", **bearer)
out["api"] = [before.status_code, after.status_code]
out["api_lag_header"] = after.get("Replica-Lag")
with reads_on_replica():
    out["read_on_replica"] = Job.objects.filter(key="written-after-the-pause").exists()
    with transaction.atomic():
        out["read_in_a_transaction"] = Job.objects.filter(key="written-after-the-pause").exists()
    Store().enqueue("replica", "written-in-a-read-only-request")
out["read_on_primary"] = Job.objects.filter(key="written-after-the-pause").exists()
out["written_on_primary"] = Job.objects.filter(key="written-in-a-read-only-request").exists()
print(json.dumps(out))
"""


def test_pages_read_on_a_standby_that_is_behind_say_so_and_everything_else_uses_the_primary(tmp_path):
    with PrivateClusters() as clusters:
        primary = clusters.primary()
        primary.query('CREATE DATABASE "durable_replica"')
        env = {"DATABASE_URL": primary.url("durable_replica")}
        manage("migrate", "--noinput", "-v", "0", env=env)
        standby = clusters.standby(primary)
        out = manage("shell", "-c", SCRIPT, env={**env, "DATABASE_REPLICA_URL": standby.url("durable_replica")})
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["page"] == 200
    assert seen["page_shows"] == ["seen-before-the-pause"]
    assert seen["page_says_behind"] is True
    assert seen["stale_page_offers_approve"] is True and seen["decision_page_says_behind"] is True
    assert seen["stale_decision"] == [409, "CANCELLED"]
    assert seen["proposed"] == [201, 201]
    assert seen["api"] == [200, 404]
    assert float(seen["api_lag_header"]) > 0
    assert seen["read_on_replica"] is False
    assert seen["read_in_a_transaction"] is True
    assert seen["read_on_primary"] is True
    assert seen["written_on_primary"] is True
