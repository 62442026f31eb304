"""What a worker's claim and finish write. Neither update of a job
can be HOT (both change `state`, which the partial indexes name), so each
writes an entry in every index of jobs_job whose condition the new row meets,
and each history row one in each of the history's indexes. These tests pin
that set: an index added over LEASED or finished rows, or a second index on
the history, costs WAL on every job and must be a decision, not an accident
(pg_waldump, migration 0017: 11 entries per job → 7; migration 0018, the
business key's uniqueness held by the search row: 7 → 5)."""

import re

import pytest
from django.db import connection

from jobs import claim
from jobs.models import Job
from jobs.store import JobSpec

pytestmark = [pytest.mark.django_db, pytest.mark.postgres,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL (partial indexes)")]


def _indexes_holding(job_id: int) -> set[str]:
    """The indexes of jobs_job whose condition the job's row meets now."""
    with connection.cursor() as cursor:
        cursor.execute("""SELECT c.relname, pg_get_expr(i.indpred, i.indrelid)
                          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
                          WHERE i.indrelid = 'jobs_job'::regclass""")
        holding = set()
        for name, condition in cursor.fetchall():
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM jobs_job WHERE id = %s AND ({condition or 'true'}))",
                           [job_id])
            if cursor.fetchone()[0]:
                holding.add(name)
    return holding


def test_a_claim_and_a_finish_each_write_two_entries_in_the_job_tables_indexes(store):
    store.enqueue("t1", "k1")
    job_id = Job.objects.get(key="k1").pk
    epoch = store.claim("t1", "k1", "w1")
    assert _indexes_holding(job_id) == {"jobs_job_pkey", "job_leased_expiry"}

    store.finish("t1", "k1", "w1", epoch, result={"ok": True})
    assert _indexes_holding(job_id) == {"jobs_job_pkey", "job_finished_unredacted"}


def test_the_business_key_is_unique_in_the_search_row_written_once_per_job():
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, i.indisunique, pg_get_indexdef(i.indexrelid) FROM pg_index AS i "
                       "JOIN pg_class AS c ON c.oid = i.indexrelid "
                       "WHERE i.indrelid = 'jobs_jobsearch'::regclass AND i.indisunique AND NOT i.indisprimary")
        assert [(name, unique) for name, unique, _ in cursor.fetchall()] == [("jobsearch_unique_tenant_key", True)]


def test_the_history_has_one_index_keyed_by_the_job_alone():
    """(job, id) made each entry 8 bytes longer and its pages split three
    times as often under the finishes (migration 0021)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index AS i "
                       "JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = 'jobs_jobevent'::regclass")
        [(name, definition)] = cursor.fetchall()
    assert name == "jobevent_job_id"
    assert definition.endswith("USING btree (job_id)")


def _no_older_snapshot() -> None:
    """Dead row versions are pruned only when no transaction of this database
    may still see them: a connection an earlier test left open in a
    transaction (the suite runs in parallel processes, in any order) would
    keep every claim's old version, and each update would move its row for
    a reason this test is not about. End such leftovers first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                       "AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)")


def _pages() -> dict[int, int]:
    """Each job's heap page, from its row's ctid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, (ctid::text::point)[0]::int FROM jobs_job")
        return dict(cursor.fetchall())


@pytest.mark.alone
@pytest.mark.django_db(transaction=True)  # committed: the dead versions can be pruned, as in a worker
def test_a_job_s_claim_and_finish_write_its_new_row_versions_in_its_own_page(store):
    """Neither update is HOT, but one that stays in its page writes less WAL:
    no lock record before the row moves, and only the bytes that changed.
    With every page packed full, each claim moved its row to another page
    (migration 0019 leaves room: fillfactor 70).

    A page is pruned only while no older transaction may see its dead
    versions, and PostgreSQL's quick check of that looks at every database
    of the server: another test process's transaction, in its own database,
    keeps rows moving. So this runs alone (`make test` runs it after the
    others)."""
    _no_older_snapshot()
    store.enqueue_many(JobSpec("t1", f"k{i}") for i in range(300))
    before = _pages()
    while (job := store.claim_next("w1")) is not None:
        store.finish(job.tenant, job.key, "w1", job.lease_epoch, result={"ok": True})
    after = _pages()
    assert set(Job.objects.values_list("state", flat=True)) == {"DONE"}
    moved = [job_id for job_id, page in before.items() if after[job_id] != page]
    assert len(moved) <= len(before) // 10, f"{len(moved)} of {len(before)} jobs left their page"


def test_the_columns_a_claim_changes_come_before_the_job_s_search_text():
    """PostgreSQL logs an update as the bytes from the first column it
    changes to the last; a claim starts at `state`. A column it changes
    placed after `search_text` (as `claimed_at`, the table's last column,
    was) makes every claim log the whole search text and proposer again
    (migration 0020)."""
    changed = re.findall(r"(?:^|, )(\w+) = ", claim._SET_LEASED)
    with connection.cursor() as cursor:
        cursor.execute("SELECT attname, attnum FROM pg_attribute WHERE attrelid = 'jobs_job'::regclass "
                       "AND attnum > 0 AND NOT attisdropped")
        position = dict(cursor.fetchall())
    assert {"state", "lease_epoch", "worker_id", "lease_until", "updated_at"} <= set(changed)
    last = max(changed, key=position.__getitem__)
    assert position[last] < position["search_text"] and position[last] < position["proposed_by"], last
