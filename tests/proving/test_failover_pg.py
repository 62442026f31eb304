"""Failover on private clusters (`make test-failover`): real workers on a
libpq multi-host URL, the primary crashed with `pg_ctl stop -m immediate`,
its standby promoted. The workers find the new primary by themselves and
every job ends once: DONE, and each email at the provider once.

FAILOVER_ROUNDS (default 2) sets the rounds; FAILOVER_SYNCHRONOUS=1 drills
synchronous replication. Each round's figures are printed (`-s` shows them).
"""

import os

import pytest

from proving.clusters import PrivateClusters, postgres_binaries_available
from proving.failover import FailoverDrill

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.failover,
    pytest.mark.skipif(not postgres_binaries_available(), reason="needs PostgreSQL's server binaries (POSTGRES_BIN)"),
    pytest.mark.timeout(900),
]


@pytest.mark.parametrize("synchronous", [os.environ.get("FAILOVER_SYNCHRONOUS") == "1"],
                         ids=lambda sync: "synchronous" if sync else "asynchronous")
def test_workers_reconnect_and_every_job_ends_once_across_a_failover(start_sim, tmp_path, synchronous):
    sim = start_sim("idempotent")
    rounds = int(os.environ.get("FAILOVER_ROUNDS", "2"))
    with PrivateClusters() as clusters:
        drill = FailoverDrill(clusters, simulator_url=sim.url, messages=sim.messages, workdir=tmp_path,
                              synchronous=synchronous)
        drill.prepare()
        results = []
        for _ in range(rounds):
            result = drill.round()
            print(result.line())
            results.append(result)
    for result in results:
        assert result.lost == [], result.line()
        assert result.sent_twice == [], result.line()
        assert result.resume_seconds is not None, result.line()
    if synchronous:
        # Nothing a worker saw committed is lost: no job claimed again.
        assert all(result.run_twice == [] for result in results), [r.line() for r in results]
