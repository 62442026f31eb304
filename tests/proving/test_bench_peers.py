"""The bench's rows beside a peer's bulk enqueue: skipped with a line
saying why when the peer cannot run, and each row's ratio taken pair by
pair. Speed is never asserted (DESIGN §12)."""

from unittest import mock

import pytest

from proving.bench import peers, run
from proving.bench.figures import BenchConfig, Results
from proving.bench.peers import PeerEnqueue
from proving.bench.report import render


@pytest.mark.django_db
def test_without_pgqueuer_installed_the_peer_rows_are_skipped_with_a_line_saying_so():
    with mock.patch("proving.bench.peers.connection") as connection, \
            mock.patch("importlib.util.find_spec", return_value=None):
        connection.vendor = "postgresql"
        missing = peers.pgqueuer_missing()
    assert missing == "pgqueuer row skipped: pgqueuer is not installed (pip install '.[peers]')"
    with mock.patch("proving.bench.peers.connection") as connection:
        connection.vendor = "sqlite"
        assert peers.pgqueuer_missing() == "pgqueuer row skipped: it needs PostgreSQL"


@pytest.mark.django_db
def test_the_bench_prints_the_skip_line_and_runs_no_peer_when_pgqueuer_cannot_run():
    config = BenchConfig(jobs=10, processes=[1], tenants=[], batches=[], lease_cap=0, peer_jobs=[100])
    results = Results()
    with mock.patch.object(run, "pgqueuer_missing", return_value="pgqueuer row skipped: why"), \
            mock.patch.object(run, "enqueue_vs_pgqueuer") as peer_run, \
            mock.patch.object(run, "enqueue_rates", return_value=[]), \
            mock.patch.object(run, "throughput_all", side_effect=RuntimeError("stop here")), \
            mock.patch.object(run, "Results", return_value=results), pytest.raises(RuntimeError):
        run.bench_run(config)
    peer_run.assert_not_called()
    assert results.notes == ["pgqueuer row skipped: why"]
    assert "pgqueuer row skipped: why" in render(results)


def test_each_peer_row_gives_median_rates_and_the_median_and_range_of_its_rounds_ratios():
    row = PeerEnqueue("pgqueuer, no keys", 3000, ours=[1.0, 0.5, 0.6], theirs=[0.5, 0.5, 0.3])
    assert row.ratios == [0.5, 0.5, 1.0]
    out = render(Results(enqueue_peers=[row]))
    assert "3 round(s) per size" in out
    line = next(line for line in out.splitlines() if "3,000 jobs vs pgqueuer, no keys" in line)
    assert "5,000" in line and "6,000" in line and "0.50× (0.50–1.00)" in line and line.endswith("MISS")
