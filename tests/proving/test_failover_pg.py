"""Failover on private clusters (`make test-failover`): real workers on a
libpq multi-host URL, the primary crashed with `pg_ctl stop -m immediate`,
its standby promoted. The workers find the new primary by themselves and
every job ends once: DONE, and each email at the provider once.

FAILOVER_ROUNDS (default 2) sets the rounds of the first test;
FAILOVER_SYNCHRONOUS=1 drills synchronous replication. Each round's figures
are printed (`-s` shows them).
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


def drill_rounds(start_sim, workdir, *, rounds: int, synchronous: bool = False, **round_options):
    sim = start_sim("idempotent")
    with PrivateClusters() as clusters:
        drill = FailoverDrill(clusters, simulator_url=sim.url, messages=sim.messages, workdir=workdir,
                              synchronous=synchronous)
        drill.prepare()
        results = []
        for _ in range(rounds):
            result = drill.round(**round_options)
            print(result.line())
            results.append(result)
    return results


@pytest.mark.parametrize("synchronous", [os.environ.get("FAILOVER_SYNCHRONOUS") == "1"],
                         ids=lambda sync: "synchronous" if sync else "asynchronous")
def test_workers_reconnect_and_every_job_ends_once_across_a_failover(start_sim, tmp_path, synchronous):
    results = drill_rounds(start_sim, tmp_path, rounds=int(os.environ.get("FAILOVER_ROUNDS", "2")),
                           synchronous=synchronous)
    for result in results:
        assert result.lost == [], result.line()
        assert result.sent_twice == [], result.line()
        assert result.resume_seconds is not None, result.line()


def test_commits_lost_in_an_asynchronous_failover_run_work_again_but_send_each_email_once(start_sim, tmp_path):
    """The standby stops receiving WAL a while before the crash, so the
    jobs finished meanwhile are not finished on the new primary: they run
    again, and their emails reach the provider under the same intent keys,
    which it answers with the message it holds."""
    [result] = drill_rounds(start_sim, tmp_path, rounds=1, lose_after=0.15, crash_after=0.4)
    assert result.done_lost > 0, result.line()
    assert any("-mail-" in key for key in result.run_twice), result.line()  # emails among them
    assert result.lost == [], result.line()
    assert result.sent_twice == [], result.line()
