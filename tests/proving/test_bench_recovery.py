"""`manage.py bench`'s recovery rows: a worker killed mid-handler, another
started right after, the seconds until the job runs again (real processes;
a 300 s lease, so only the starting worker's takeover explains it). Speed is
never asserted here (DESIGN §12)."""

import re

import pytest

from jobs.models import Job
from proving.bench.common import TENANT_RECOVERY
from proving.bench.figures import Results
from proving.bench.recovery import LEASE, RESTARTS, recovery_rows
from proving.bench.report import render

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_each_way_of_restarting_is_measured_before_the_lease_ends_and_leaves_nothing_behind():
    seconds = recovery_rows(1)
    assert set(seconds) == set(RESTARTS)
    for runs in seconds.values():
        [(again, started)] = runs
        assert 0 < started < again < LEASE
    assert not Job.objects.filter(tenant=TENANT_RECOVERY).exists()
    out = render(Results(recovery=seconds))
    assert "RECOVERY AFTER KILL -9" in out
    for way in RESTARTS:
        assert re.search(rf"{re.escape(way)} +1 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +(ok|MISS)", out), out
    print(out)
