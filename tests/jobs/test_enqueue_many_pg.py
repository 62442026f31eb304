"""`enqueue_many` on PostgreSQL: each chunk copied (COPY) into the
session's table, then one statement making its jobs, planned for the chunk
it writes."""

import json
from datetime import datetime, timezone

import pytest

from jobs.models import Job, JobEvent, JobSearch
from jobs.store import JobSpec
from tests.support import auto_explained, plan_nodes

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def test_a_bulk_enqueue_is_planned_for_its_chunk_however_many_small_ones_ran_before(store):
    """psycopg prepares a statement it has run twice, and after five runs
    PostgreSQL may keep the prepared statement's generic plan, which guesses
    ten rows for each column array whatever its length (a dozen small
    enqueues first). Whichever plan runs, no node of a chunk's plan handles
    more than a few rows per job: the chunk's search rows are matched to
    its jobs by a hash, never each against each."""
    for i in range(12):
        store.enqueue_many(JobSpec("small", f"s{i}-{j}") for j in range(3))
    chunk = 2000
    with auto_explained("auto_explain.log_analyze = on", "auto_explain.log_timing = off",
                        "auto_explain.log_format = json") as plans:
        assert store.enqueue_many(JobSpec(f"t{j % 7}", f"k{j:04d}") for j in range(chunk)) == chunk
    [plan] = [json.loads(p.split("plan:", 1)[1]) for p in plans if "INSERT INTO jobs_jobevent" in p]
    handled = max((node["Actual Rows"] * node["Actual Loops"], node["Node Type"]) for node in plan_nodes(plan["Plan"]))
    assert handled[0] <= 3 * chunk, handled
    assert Job.objects.count() == JobSearch.objects.count() == JobEvent.objects.count() == chunk + 36


def test_a_bulk_enqueue_writes_each_column_as_given(store):
    """The copied rows carry every kind of value a job may hold: NULLs,
    text COPY (or an array's syntax) would have to escape, JSON, times."""
    odd = 'a "quoted", {braced} \\ back\\slashed NULL \\N\ttabbed\nlined\r ü'
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    specs = [JobSpec("t", odd, payload={"k": odd, "n": [1, None]}, priority=-32768, run_at=at, max_attempts=9,
                     subject_type="company.quote", subject_id=42, subject_version=3),
             JobSpec("t", "NULL", payload={}, priority=32767),
             JobSpec("t", odd, payload={"second": True})]  # (a key given twice: the first is kept)
    assert store.enqueue_many(specs, actor="agent:x") == 2
    first, second = Job.objects.order_by("id")
    assert (first.key, first.payload, first.priority, first.next_attempt_at, first.max_attempts,
            first.subject_type, first.subject_id, first.subject_version, first.proposed_by) == (
        odd, {"k": odd, "n": [1, None]}, -32768, at, 9, "company.quote", "42", 3, "agent:x")
    assert (second.key, second.payload, second.priority, second.next_attempt_at, second.subject_version,
            second.state) == ("NULL", {}, 32767, None, None, "READY")
    assert first.id < second.id and first.created_at == second.created_at
