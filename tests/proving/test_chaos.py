"""`manage.py chaos` end to end: real worker processes SIGKILLed (and, on
PostgreSQL, their database connections cut) at random moments while they send
real email through a simulator process; no email is sent twice or lost
(DESIGN §6, §12)."""

import re

import pytest

from jobs.models import Job
from operations.models import Operation

pytestmark = [pytest.mark.acceptance]


@pytest.mark.parametrize("faults", [
    # Kills stop once every job is settled, which a fast run reaches before
    # the last: what matters is that workers really died mid-run.
    pytest.param({"kills": 10}, id="kills"),
    # As a database restart or failover does, between worker kills.
    pytest.param({"kills": 2, "cut-connections": 4}, id="cuts", marks=pytest.mark.postgres),
])
def test_chaos_without_duplicating_or_losing_an_email(manage, faults):
    args = [arg for name, n in faults.items() for arg in (f"--{name}", str(n))]
    result = manage.run("chaos", "--jobs", "50", "--mode", "idempotent", "--seed", "17", "--workers", "3", *args,
                        timeout=180)

    out = result.stdout
    assert "1 message(s): 50 job(s)" in out, out
    assert "messages accepted by the provider: 50" in out, out
    assert "duplicates: 0  lost: 0  stray messages: 0" in out, out
    assert int(re.search(rf"kills (\d+)/{faults['kills']}", out).group(1)) >= 1, out
    if "cut-connections" in faults:
        assert int(re.search(rf"connections cut (\d+)/{faults['cut-connections']}", out).group(1)) >= 1, out
    assert re.search(r"^handler attempts per job \(histogram\): 1 \d+", out, re.M), out
    assert re.search(r"^worker writes: ", out, re.M), out
    assert Job.objects.filter(tenant="chaos", state="DONE").count() == 50
    assert Operation.objects.filter(tenant="chaos", state="ACCEPTED", receipt__isnull=False).count() == 50


def test_chaos_refuses_to_cut_connections_on_sqlite(manage, settings):
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("the refusal is SQLite's")
    result = manage.run("chaos", "--jobs", "1", "--cut-connections", "1", check=False)

    assert result.returncode != 0
    assert "--cut-connections needs PostgreSQL" in result.stderr
