#!/usr/bin/env python3
"""Curated mutants: break, one line at a time, the rules that matter most and
check that the tests meant to guard each rule notice.

    python tools/mutants.py                  # every mutant (`make mutants`)
    python tools/mutants.py fence-epoch-finish digest-check   # some of them
    python tools/mutants.py --list

Each mutant is a named list of one-line edits matched by EXACT source text
(optionally after a unique anchor line, when the same text appears more than
once). The work tree is never touched: the project is copied once into a
temporary directory (one copy per parallel job, `--jobs`, one per CPU by
default), each mutant is applied to a copy, the tests listed for it run
there, and the file is restored before that copy takes the next one. A mutant is
"killed" when those tests fail and "SURVIVED" when they pass; the script
exits 1 if any mutant survives, if a pattern is not found (the code it
targets changed: update the pattern — the message says which), or if the
tests do not pass on the unmutated copy first.

Databases: mutants run on SQLite (a fresh test database under the temporary
directory). A mutant marked `postgres` concerns PostgreSQL-only SQL (SKIP
LOCKED): it runs against `--postgres-url` (default $MUTANTS_POSTGRES_URL or
postgres://postgres@127.0.0.1:5432/durable_mutants); with `--skip-postgres`
it is reported as skipped instead.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FENCE_TESTS = ["tests/jobs/test_fence.py"]
PROTOCOL = "tests/operations/test_protocol.py"
RECONCILIATION = "tests/operations/test_reconciliation.py"
OUTBOX = "tests/jobs/test_outbox.py"
CLAIM_SCALE = "tests/jobs/test_claim_scale_pg.py"
DECISIONS = "tests/console/test_decisions.py"
SCHEDULES = "tests/jobs/test_schedules.py"
TASKS_CONFORMANCE = "tests/jobs/tasks_conformance"
EFFECTS_IN_DOUBT = "tests/company/test_effects_in_doubt.py"
DECISIONS_HARDENING = "tests/console/test_decisions_hardening.py"
MASKING_EVERYWHERE = "tests/console/test_masking_everywhere.py"
FOUR_EYES = "tests/console/test_four_eyes_counts.py"
BULK_CUT = "tests/console/test_bulk_interrupted.py"
TAKEOVER = "tests/jobs/test_takeover.py"
OPERATION_FENCE_TESTS = ["tests/jobs/test_fence.py::test_an_operation_record_outside_the_current_fence_raises_conflict_and_changes_nothing"]


@dataclass(frozen=True)
class Edit:
    path: str
    old: str  # exact text on one line
    new: str
    after: str = ""  # a unique anchor: the edit applies to the first `old` after it


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    postgres: bool = False


def _current(column: str) -> str:
    # What a write would use if it forgot the caller's fence and trusted the row.
    return f"Job.objects.get(tenant=tenant, key=key).{column},"


def _fence_mutants() -> list[Mutant]:
    mutants = []
    # renew is one line; finish and wait pass their fence one argument per line.
    mutants.append(Mutant("fence-epoch-renew", "renew checks the lease epoch", (
        Edit("jobs/store.py", "worker_id, epoch, State.LEASED, clock",
             "worker_id, Job.objects.get(tenant=tenant, key=key).lease_epoch, State.LEASED, clock"),), tuple(FENCE_TESTS)))
    mutants.append(Mutant("fence-worker-renew", "renew checks the worker id", (
        Edit("jobs/store.py", "tenant, key, worker_id, epoch, State.LEASED, clock",
             "tenant, key, Job.objects.get(tenant=tenant, key=key).worker_id, epoch, State.LEASED, clock"),),
        tuple(FENCE_TESTS)))
    for write in ("finish", "wait"):
        anchor = f'            "{write}",'
        mutants.append(Mutant(f"fence-epoch-{write}", f"{write} checks the lease epoch", (
            Edit("jobs/store.py", "            epoch,", "            " + _current("lease_epoch"), after=anchor),),
            tuple(FENCE_TESTS)))
        mutants.append(Mutant(f"fence-worker-{write}", f"{write} checks the worker id", (
            Edit("jobs/store.py", "            worker_id,", "            " + _current("worker_id"), after=anchor),),
            tuple(FENCE_TESTS)))
    # fail and release read the holder first (for the retry decision, the
    # attempt count) and then write under the fence: both lines must forget it.
    for write, method in (("fail", "    def fail("), ("release", "    def release(")):
        anchor = f'            "{write}",'
        holder = "        job = self._holder(tenant, key, worker_id, epoch)"
        mutants.append(Mutant(f"fence-epoch-{write}", f"{write} checks the lease epoch", (
            Edit("jobs/store.py", holder,
                 "        job = self._holder(tenant, key, worker_id, Job.objects.get(tenant=tenant, key=key).lease_epoch)",
                 after=method),
            Edit("jobs/store.py", "            epoch,", "            " + _current("lease_epoch"), after=anchor),),
            tuple(FENCE_TESTS)))
        mutants.append(Mutant(f"fence-worker-{write}", f"{write} checks the worker id", (
            Edit("jobs/store.py", holder,
                 "        job = self._holder(tenant, key, Job.objects.get(tenant=tenant, key=key).worker_id, epoch)",
                 after=method),
            Edit("jobs/store.py", "            worker_id,", "            " + _current("worker_id"), after=anchor),),
            tuple(FENCE_TESTS)))
    # The check on a job in hand (jobs.fence), which under_fence holds for its block.
    guard = "    return job.state == State.LEASED and job.lease_epoch == epoch and job.worker_id == worker_id"
    mutants.append(Mutant("fence-epoch-under-fence", "under_fence checks the lease epoch", (
        Edit("jobs/fence.py", guard, guard.replace(" and job.lease_epoch == epoch", ""), after="def fence_holds("),),
        tuple(FENCE_TESTS)))
    mutants.append(Mutant("fence-worker-under-fence", "under_fence checks the worker id", (
        Edit("jobs/fence.py", guard, guard.replace(" and job.worker_id == worker_id", ""), after="def fence_holds("),),
        tuple(FENCE_TESTS)))
    for record, function in (("receipt", "def _accept("), ("outcome", "def _fail("), ("resend", "def _prepare_resend(")):
        mutants.append(Mutant(f"fence-operation-{record}", f"the operation's {record} is written under the job's fence", (
            Edit("operations/protocol.py", "with ctx.under_fence():", "with transaction.atomic():", after=function),),
            tuple(OPERATION_FENCE_TESTS)))
    return mutants


# The fair claim's plan: the test that reads it run after run (auto_explain).
_FAIR_PLAN_TESTS = ("tests/jobs/test_claim_scale_pg.py::test_the_fair_claim_runs_with_its_generic_plan_from_its_first_run",)
_EMPTY_TABLE_TESTS = ("tests/jobs/test_claim_scale_pg.py::"
                      "test_a_claim_planned_over_an_empty_table_still_walks_the_indexes_once_it_fills",)
# The batch fence (fence_of_batch, jobs/sql/fence.sql) serves both the batch finish and the
# lease renewals: a mutant of it must be caught through each.
_BATCH_FENCE_TESTS = ("tests/jobs/test_claim_batch.py::test_finish_many_checks_both_halves_of_each_jobs_fence",
                      "tests/jobs/test_store.py::test_renew_many_extends_each_lease_held_under_its_fence_and_no_other")

REPLICA_READS = "tests/test_replica_reads_pg.py"

MUTANTS: list[Mutant] = [
    *_fence_mutants(),
    Mutant("takeover-at-start", "a starting worker takes back a gone holder's leases before it claims", (
        Edit("jobs/worker.py", "        self._take_over_gone()", "        pass"),),
        (f"{TAKEOVER}::test_a_starting_worker_takes_back_at_once_the_leases_of_a_dead_process_of_its_host",)),
    Mutant("takeover-other-place", "a holder of another boot or pid namespace is never judged gone", (
        Edit("jobs/holders.py", 'if place is None or found is None or found["place"] != place:',
             "if place is None or found is None:"),),
        (f"{TAKEOVER}::test_another_boot_or_namespace_or_an_explicit_id_is_never_judged",
         f"{TAKEOVER}::test_a_starting_worker_leaves_live_and_foreign_holders_leases_alone")),
    Mutant("takeover-other-hostname", "a holder of another host name is never judged gone, whatever its boot id", (
        Edit("jobs/holders.py", '    if found["host"] != socket.gethostname():', "    if False:"),),
        (f"{TAKEOVER}::test_another_boot_or_namespace_or_an_explicit_id_is_never_judged",)),
    Mutant("takeover-pid-reuse", "a reused pid (another start time) does not make a gone holder look alive", (
        Edit("jobs/holders.py", "    if started != start:", "    if False:"),),
        (f"{TAKEOVER}::test_an_ended_process_a_zombie_and_a_reused_pid_are_gone_a_live_one_is_not",)),
    Mutant("takeover-live-pid", "a live process of this host keeps its leases", (
        Edit("jobs/holders.py", '    if state in ("Z", "X"):', "    if True:"),),
        (f"{TAKEOVER}::test_a_starting_worker_leaves_live_and_foreign_holders_leases_alone",)),
    Mutant("takeover-zombie", "a killed process not yet reaped (a zombie) is gone", (
        Edit("jobs/holders.py", '    if state in ("Z", "X"):', "    if False:"),),
        (f"{TAKEOVER}::test_an_ended_process_a_zombie_and_a_reused_pid_are_gone_a_live_one_is_not",)),
    Mutant("takeover-stable-id-promise", "a worker takes back its own id's leases only under the stable-id promise", (
        Edit("jobs/worker.py", "restarted=cfg.worker_id if cfg.stable_id else None", "restarted=cfg.worker_id"),),
        (f"{TAKEOVER}::test_a_worker_under_a_stable_id_takes_back_its_previous_process_leases_only_with_the_promise",)),
    Mutant("takeover-stable-id-flag", "run_worker --worker-id makes the promise of one process per id", (
        Edit("jobs/management/commands/run_worker.py", '            stable_id=opts["worker_id"] is not None,',
             "            stable_id=False,"),),
        (f"{TAKEOVER}::test_kill_9_mid_handler_then_a_restart_under_the_same_worker_id_runs_the_job_again",)),
    Mutant("takeover-says-why", "a takeover's history row says why its holder is known to be gone", (
        Edit("jobs/store.py", 'why=lambda job: f"worker {job.worker_id} is gone: {holders[job.worker_id]} (epoch {job.lease_epoch}); "',
             'why=lambda job: f"worker {job.worker_id} did not renew its lease (epoch {job.lease_epoch}); "'),),
        (f"{TAKEOVER}::test_a_starting_worker_takes_back_at_once_the_leases_of_a_dead_process_of_its_host",)),
    Mutant("claim-epoch-increment", "a claim (or takeover) by name moves the epoch on", (
        Edit("jobs/store.py", "            epoch = job.lease_epoch + 1", "            epoch = job.lease_epoch"),),
        tuple(FENCE_TESTS)),
    Mutant("claim-next-epoch-increment", "claim_next moves the epoch on", (
        Edit("jobs/sql/claim.sql", "lease_epoch = j.lease_epoch + 1,", "lease_epoch = j.lease_epoch,"),),
        ("tests/jobs/test_store.py",)),
    Mutant("renewal-keeps-claim-time", "a renewal moves the lease only, not the claim's time (updated_at)", (
        Edit("jobs/store.py", "        if target != State.LEASED:", "        if True:", after="    def _fenced("),),
        ("tests/jobs/test_store.py::test_a_renewal_keeps_the_claim_s_time_which_the_attempt_s_row_records",)),
    Mutant("batch-finish-claim-time", "a batch's finish records each attempt's claim time, read before it moves", (
        Edit("jobs/claim.py", 'claimed_at="c.claimed_at[width_bucket(d.id, c.ids)]",', 'claimed_at="d.updated_at",'),),
        ("tests/jobs/test_claim_batch.py::test_a_batch_s_finish_records_each_attempt_s_claim_not_its_renewal",),
        postgres=True),
    Mutant("claim-cursor-per-connection", "the kept claim cursor is the current connection's", (
        Edit("jobs/claim.py", "    if made_for is not db.connection or logged != db.queries_logged:",
             "    if made_for is None or logged != db.queries_logged:"),),
        ("tests/jobs/test_pooled_statements_pg.py::test_claims_share_one_cursor_per_connection_and_a_new_connection_gets_its_own",),
        postgres=True),
    Mutant("claim-bitmap-scans", "the claim functions never answer the claim index's question by a bitmap scan", (
        Edit("jobs/pooling.py", ' SET enable_seqscan = off SET enable_bitmapscan = off"', ' SET enable_seqscan = off"'),),
        ("tests/jobs/test_claim_scale_pg.py::test_a_single_claim_walks_the_claim_index_in_order_where_a_bitmap_scan_looks_cheaper",),
        postgres=True),
    Mutant("one-finish-claim-time", "one job's finish records its attempt's claim time, read before it moves", (
        Edit("jobs/claim.py", 'claimed_at="c.claimed_at",', 'claimed_at="d.updated_at",'),),
        ("tests/jobs/test_claim_batch.py::test_a_batch_s_finish_records_each_attempt_s_claim_not_its_renewal",),
        postgres=True),
    Mutant("claim-limit-unread", "a batch claim walks the claim index in order whatever the statistics", (
        Edit("jobs/sql/claim.sql", "LIMIT (SELECT {limit})", "LIMIT {limit}"),),
        ("tests/jobs/test_claim_scale_pg.py::test_a_batch_claim_reads_the_head_of_a_deep_backlog_not_all_of_it_whatever_the_statistics",),
        postgres=True),
    Mutant("batch-short-not-refilled", "a batch short of its size asks the tenants that gave work for the rest", (
        Edit("jobs/claim.py", "        if jobs and len(jobs) < limit and population > 1:",
             "        if False:"),),
        ("tests/jobs/test_claim_batch.py::test_a_batch_is_full_when_the_other_tenants_with_ready_jobs_have_none_it_may_take",),
        postgres=True),
    Mutant("drained-asked-twice", "a claim asks once which sampled tenants are left without READY work", (
        Edit("jobs/sql/claim.sql", "AS t OFFSET 0) AS d)", "AS t) AS d)"),),
        ("tests/jobs/test_claim_scale_pg.py::test_a_claim_asks_once_whether_each_sampled_tenant_is_left_without_ready_work",),
        postgres=True),
    Mutant("retention-page-scans-from-start", "a retention page reads the index from its key on", (
        Edit("jobs/retention.py", "rows.filter(Q(finished_at__gte=finished_at) & (Q(finished_at__gt=finished_at) | Q(id__gt=job_id)))",
             "rows.filter(Q(finished_at__gt=finished_at) | Q(finished_at=finished_at, id__gt=job_id))"),),
        ("tests/jobs/test_retention.py::test_a_page_after_a_key_reads_the_index_from_that_key_on",), postgres=True),
    Mutant("retention-page-skips-ties", "a retention page goes on through the ties of its key's instant", (
        Edit("jobs/retention.py", "(Q(finished_at__gt=finished_at) | Q(id__gt=job_id))", "Q(finished_at__gt=finished_at)"),),
        ("tests/jobs/test_retention.py::test_jobs_finished_at_one_instant_are_each_visited_once_in_pages_of_one",)),
    Mutant("jit-left-on", "the application's connections run without PostgreSQL's JIT", (
        Edit("jobs/pooling.py", 'cursor.execute("SET jit = off")', 'cursor.execute("SELECT 1")'),),
        ("tests/jobs/test_claim_scale_pg.py::test_a_claim_estimated_dear_is_not_jit_compiled",), postgres=True),
    Mutant("fair-claim-replanned", "the fair claim runs with its generic plan whatever the statistics", (
        Edit("jobs/pooling.py", '"SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET',
             '"SET enable_seqscan = off SET'),),
        _FAIR_PLAN_TESTS, postgres=True),
    Mutant("claims-prepared", "directly, the claims run through the functions that fix their plans", (
        Edit("jobs/pooling.py", "    with sending(sql, params, cursor.db) as sent:",
             "    with sending(sql, params, cursor.db) if settings.DATABASE_POOL_MODE == 'transaction' "
             "else contextlib.nullcontext(sql) as sent:"),),
        (*_FAIR_PLAN_TESTS, *_EMPTY_TABLE_TESTS, "tests/jobs/test_claim_scale_pg.py::"
         "test_the_capped_claim_s_tenant_statement_keeps_one_plan_whatever_random_points_it_draws"), postgres=True),
    Mutant("prune-replanned", "the sample pruner keeps its generic plans", (
        Edit("jobs/migrations/0023_prune_planned_once.py", 'SET plan_cache_mode = force_generic_plan"',
             'RESET plan_cache_mode"'),),
        ("tests/jobs/test_claim_scale_pg.py::test_the_pruner_plans_its_statements_once_not_on_every_call",),
        postgres=True),
    Mutant("fence-epoch-batch", "a batch's finishes and lease renewals check each job's lease epoch", (
        Edit("jobs/sql/fence.sql", "AND {t}.lease_epoch = {epoch}", "AND true"),), _BATCH_FENCE_TESTS, postgres=True),
    Mutant("fence-worker-batch", "a batch's finishes and lease renewals check the worker id", (
        Edit("jobs/sql/fence.sql", "AND {t}.worker_id = (SELECT %(worker)s::varchar)", "AND true"),), _BATCH_FENCE_TESTS,
        postgres=True),
    Mutant("batch-values-unordered", "each row of a batch's finish or renewal finds its own epoch and result", (
        Edit("jobs/claim.py", "    order = sorted(range(len(ids)), key=ids.__getitem__)", "    order = range(len(ids))"),),
        ("tests/jobs/test_claim_scale_pg.py::"
         "test_a_batch_s_finish_and_renewal_handle_rows_in_proportion_to_the_batch_whatever_the_statistics",),
        postgres=True),
    Mutant("enqueue-many-keeps-the-last", "a key given twice to enqueue_many keeps its first spec (PostgreSQL)", (
        Edit("jobs/sql/enqueue.sql", "ORDER BY tenant, key, n", "ORDER BY tenant, key, n DESC"),),
        ("tests/jobs/test_enqueue_many_pg.py::test_a_bulk_enqueue_writes_each_column_as_given",), postgres=True),
    Mutant("enqueue-many-copy-unnumbered", "a bulk enqueue's copied rows keep their place in the chunk: the "
           "first of a key given twice is kept and ids follow the order given (PostgreSQL)", (
        Edit("jobs/store.py", "copy.write_row((n, *row))", "copy.write_row((0, *row))"),),
        ("tests/jobs/test_store.py::"
         "test_enqueue_many_keeps_the_first_of_a_key_given_twice_and_numbers_jobs_in_the_order_given",
         "tests/jobs/test_enqueue_many_pg.py::test_a_bulk_enqueue_writes_each_column_as_given"), postgres=True),
    Mutant("enqueue-lock-order", "concurrent enqueues lock the search rows in (tenant, key) order, before the "
           "jobs and their tenant's ready row (PostgreSQL)", (
        Edit("jobs/sql/enqueue.sql", "    SELECT id, tenant, key, search_text FROM numbered ORDER BY tenant, key",
             "    SELECT id, tenant, key, search_text FROM numbered ORDER BY n"),
        Edit("jobs/store.py", "    if _is_postgres():", "    if False:", after="def _insert_with_search_row("),),
        ("tests/jobs/test_enqueue_race_pg.py",), postgres=True),
    Mutant("bulk-search-text-undeclared", "a bulk enqueue's search text holds the action's searchable texts", (
        Edit("jobs/search.py", '[proposed_by], _declared_texts(action, payload, job))', '[proposed_by], [])'),),
        ("tests/jobs/test_search_rows.py::test_a_bulk_enqueue_writes_the_search_text_a_single_enqueue_writes",)),
    Mutant("housekeeping-prepared", "a worker's housekeeping connection prepares none of its statements", (
        Edit("jobs/worker.py", "        pooling.prepare_nothing_here()", "        pass"),),
        ("tests/jobs/test_claim_scale_pg.py::"
         "test_a_worker_s_housekeeping_run_over_an_empty_table_reads_the_indexes_once_it_fills",), postgres=True),
    Mutant("claim-calls-unprepared", "directly, the claim statements' calls are prepared", (
        Edit("jobs/pooling.py", "        raw.prepare_threshold = 0  #", "        pass  #"),),
        ("tests/jobs/test_pooled_statements_pg.py::"
         "test_directly_every_claim_runs_through_a_function_that_keeps_its_generic_plan",), postgres=True),
    Mutant("statement-function-seqscan", "a claim function's plan made over an empty table walks the indexes", (
        Edit("jobs/pooling.py", '"SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET',
             '"SET plan_cache_mode = force_generic_plan SET'),),
        _EMPTY_TABLE_TESTS, postgres=True),
    Mutant("fence-recheck-finish-many", "a finish tests the fence again on a row another transaction changed", (
        Edit("jobs/sql/fence.sql", "AND {t}.state = (SELECT 'LEASED'::varchar)", "AND true"),),
        ("tests/jobs/test_finish_fence_race_pg.py",), postgres=True),
    Mutant("skip-locked", "concurrent claimers step over locked rows instead of queueing (the fair claim)", (
        Edit("jobs/sql/claim.sql", "FOR UPDATE SKIP LOCKED", "FOR UPDATE",
             after="SELECT j.id, j.state FROM jobs_job AS j WHERE j.id = o.id"),),
        ("tests/jobs/test_skip_locked_pg.py",), postgres=True),
    Mutant("skip-locked-one", "concurrent claimers step over locked rows instead of queueing (the fair claim of one job)", (
        Edit("jobs/sql/claim.sql", "FOR UPDATE SKIP LOCKED", "FOR UPDATE", after="-- claim_fair_one --"),),
        ("tests/jobs/test_skip_locked_pg.py",), postgres=True),
    Mutant("fair-one-least-loaded", "the fair claim of one job asks the least-loaded tenant first", (
        Edit("jobs/sql/claim.sql", "SELECT tenant, row_number() OVER (ORDER BY leased, lottery) AS position FROM load",
             "SELECT tenant, row_number() OVER (ORDER BY lottery) AS position FROM load"),),
        ("tests/jobs/test_fairness.py::test_least_loaded_tenant_is_served_first",
         "tests/jobs/test_fairness.py::test_claims_alternate_between_tenants_while_their_jobs_run"), postgres=True),
    Mutant("fair-one-cap", "the capped claim of one job passes over a tenant at its cap", (
        Edit("jobs/sql/claim.sql", "WHERE leased < %(cap)s", "WHERE true", after="-- claim_cap_one --"),),
        ("tests/jobs/test_fairness.py::test_a_tenant_at_its_lease_cap_waits_without_blocking_others",
         "tests/jobs/test_claim_scale_pg.py"), postgres=True),
    Mutant("fair-resample", "a claim whose sample was all drained tenants samples again before the plain claim", (
        Edit("jobs/claim.py", "        if not jobs and pruned:", "        if False:"),),
        ("tests/jobs/test_claim_scale_pg.py::test_a_claim_whose_sample_was_all_drained_samples_again_instead_of_"
         "walking_the_whole_claim_index",), postgres=True),
    Mutant("cap-fallback", "a capped claim goes past sampled tenants at their cap to ones it can serve", (
        Edit("jobs/claim.py", "if not tried and not tenants:", "if False:"),),
        ("tests/jobs/test_fairness.py::test_with_most_tenants_at_their_cap_a_claim_still_finds_the_ones_under_it",),
        postgres=True),
    Mutant("cap-locks-wanted", "a capped claim holds the locks of no more tenants than it may take jobs", (
        Edit("jobs/sql/claim.sql", "LIMIT {want}", ""),),
        ("tests/jobs/test_fairness.py::test_a_capped_claim_holds_the_locks_of_no_more_tenants_than_it_may_take_jobs",),
        postgres=True),
    Mutant("cap-eligible", "a capped claim tries only tenants with an eligible job", (
        Edit("jobs/sql/claim.sql", "WHERE leased < %(cap)s AND {has_eligible}", "WHERE leased < %(cap)s"),),
        ("tests/jobs/test_fairness.py::test_under_a_cap_tenants_with_only_later_work_do_not_hide_the_ones_with_work_now",),
        postgres=True),
    Mutant("one-tenant-gate", "the one-tenant claim takes nothing while two tenants hold READY work", (
        Edit("jobs/sql/claim.sql", "FROM ready_tenants AS r WHERE r.n <= 1)", "FROM ready_tenants AS r)"),),
        ("tests/jobs/test_claim_scale_pg.py::test_with_one_tenant_the_claim_is_the_tenant_s_own_and_a_second_tenant_"
         "turns_the_fair_claim_back_on",), postgres=True),
    Mutant("skip-locked-tenant", "concurrent claimers step over locked rows (the claim for listed tenants)", (
        Edit("jobs/sql/claim.sql", "FOR UPDATE SKIP LOCKED", "FOR UPDATE", after="-- claim_plain --"),),
        ("tests/jobs/test_skip_locked_pg.py",), postgres=True),
    # A provider's lookup may list other operations' messages: only one that
    # carries this operation's client reference is ours (the filter in
    # connectors/email_http.py; if that line is reworded, update the pattern).
    Mutant("lookup-reference-check", "a lookup adopts only a message carrying this operation's reference", (
        Edit("connectors/email_http.py",
             'ours = [m for m in matches if m.get("client_reference") == client_reference]',
             "ours = list(matches)"),),
        (f"{RECONCILIATION}::test_a_lookup_that_ignores_the_reference_does_not_adopt_another_message",)),
    Mutant("digest-check", "the same step asked to send a different request sends nothing", (
        Edit("operations/protocol.py", "    if operation.request_digest != digest:", "    if False:"),),
        (f"{PROTOCOL}::test_same_step_with_a_different_request_is_a_digest_mismatch_and_sends_nothing",)),
    Mutant("outbox-quarantine-spent", "an event claimed too often without acknowledgement is quarantined", (
        Edit("jobs/outbox.py", "        spent = [e for e in batch if e.attempts >= policy.max_attempts]",
             "        spent = []"),),
        (f"{OUTBOX}::test_a_relay_that_died_mid_delivery_too_often_quarantines_the_event",)),
    Mutant("outbox-quarantine-failing", "an event whose delivery keeps failing is quarantined", (
        Edit("jobs/outbox.py", "    if event.attempts >= policy.max_attempts:", "    if False:"),),
        (f"{OUTBOX}::test_a_poison_event_is_quarantined_while_the_100_events_behind_it_are_published",
         f"{OUTBOX}::test_a_requeued_event_is_published_after_its_consumer_is_fixed")),
    Mutant("timer-version-reread", "a timer re-reads its subject and re-plans when the version changed", (
        Edit("jobs/timers.py",
             "if subject is not None and timer.subject_version is not None and subject.version != timer.subject_version:",
             "if False:"),),
        ("tests/jobs/test_timers.py::test_due_date_moved_replans_the_timer_to_the_new_date",
         "tests/jobs/test_timers.py::test_due_date_moved_earlier_fires_at_the_next_sweep")),
    Mutant("hmac-comparison", "an inbound webhook with a wrong signature is refused", (
        Edit("jobs/inbound.py", "    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):",
             "    if False:"),),
        ("tests/jobs/test_inbound.py::test_a_bad_signature_is_refused_and_nothing_is_applied",)),
    Mutant("in-doubt-trusts-lost", "a finish sent again after a broken connection counts as done only if it was written", (
        Edit("jobs/completer.py", 'mine = self.store.recorded_by(self.config.worker_id, again, "finish")',
             "mine = {job.id for job in again}"),),
        ("tests/jobs/test_worker_writes.py",)),
    Mutant("flush-keeps-doubt", "a batch's early write that breaks keeps its finishes for the next write", (
        Edit("jobs/completer.py", "            if final:  # the slot's last write", "            if True:"),),
        ("tests/jobs/test_worker_writes.py",)),
    Mutant("settle-trusts-conflict", "a wait or failure sent again counts as recorded only if it was written", (
        Edit("jobs/completer.py", "recorded = self.store.recorded_by(self.config.worker_id, [job], kind)",
             "recorded = {job.id: 'READY'}"),),
        ("tests/jobs/test_worker_writes.py",)),
    Mutant("settle-checks-history", "a wait or failure whose reply was lost is found in the history", (
        Edit("jobs/completer.py", "                    if job.id in doubt:", "                    if False:"),),
        ("tests/jobs/test_worker_writes.py",)),
    Mutant("recorded-by-epoch", "a worker's outcome counts only under the epoch it claimed", (
        Edit("jobs/store.py", "if epochs[job_id] == epoch}", "if epochs[job_id] >= 0}"),),
        ("tests/jobs/test_worker_writes.py",)),
    Mutant("cap-eligible-by-key", "a capped claim asks each candidate tenant for work by that tenant's index "
           "entries, not by a semi-join over every READY job", (
        Edit("jobs/sql/claim.sql", "(SELECT e.id FROM jobs_job AS e WHERE", "EXISTS (SELECT 1 FROM jobs_job AS e WHERE"),
        Edit("jobs/sql/claim.sql", "ORDER BY {claim_order} LIMIT 1) IS NOT NULL", ")")),
        (f"{CLAIM_SCALE}::test_the_capped_claim_asks_each_candidate_tenant_for_work_by_its_own_index_entries",),
        postgres=True),
    Mutant("cap-advisory-lock", "a tenant's leases are granted only under its advisory lock (the cap holds when "
           "work falls due during another claim)", (
        Edit("jobs/sql/claim.sql", "WHERE pg_try_advisory_xact_lock(1785684595, hashtext(o.tenant))",
             "WHERE 1785684595 IS NOT NULL"),),
        (f"{CLAIM_SCALE}::test_work_that_falls_due_while_another_claim_is_uncommitted_does_not_take_the_tenant_past_"
         "its_cap",), postgres=True),
    Mutant("decision-permission", "a decision needs the permission, not only a role that allows it", (
        Edit("jobs/access.py", "    if not user.has_perm(d.permission):", "    if False:"),),
        (f"{DECISIONS}::test_a_decision_needs_both_the_permission_and_the_role_and_either_alone_is_refused",)),
    Mutant("decision-role", "a decision needs a role that allows it in the job's tenant, not only the permission", (
        Edit("jobs/access.py", '    if role != "superuser" and role not in d.roles:', "    if False:"),),
        (f"{DECISIONS}::test_a_decision_needs_both_the_permission_and_the_role_and_either_alone_is_refused",)),
    Mutant("console-next-offsite", "after a decision the console follows `next` only to this site", (
        Edit("console/views.py",
             "    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):",
             "    if target:"),),
        (f"{DECISIONS}::test_a_decision_follows_next_on_this_site_and_never_off_it",)),
    Mutant("schedule-revalidate-edit", "a Schedule whose function or hook is edited is validated again on save", (
        Edit("jobs/schedules.py", '        if stored == {"func": instance.func, "hook": instance.hook}:',
             "        if stored is not None:"),),
        (f"{SCHEDULES}::test_an_edited_schedule_is_validated_again_and_a_save_that_keeps_its_function_is_not_refused",)),
    Mutant("schedule-unchanged-save", "the scheduler's save of a schedule whose function did not change is not refused", (
        Edit("jobs/schedules.py", '        if stored == {"func": instance.func, "hook": instance.hook}:',
             "        if False:"),),
        (f"{SCHEDULES}::test_an_edited_schedule_is_validated_again_and_a_save_that_keeps_its_function_is_not_refused",)),
    Mutant("schedule-form-check", "the admin form refuses a schedule that keeps an unlisted function", (
        Edit("jobs/schedule_admin.py", '            schedule_validate(func=data.get("func", ""), hook=None)',
             "            pass"),),
        (f"{SCHEDULES}::test_a_superuser_saving_a_schedule_that_names_an_unlisted_function_is_refused_in_the_form",)),
    Mutant("task-return-not-retried", "a task whose return value JSON cannot hold fails once and never runs again", (
        Edit("jobs/tasks_backend.py", "        raise TaskReturnRefused(exc) from exc", "        raise TaskRaised(exc) from exc"),),
        (f"{TASKS_CONFORMANCE}/test_conformance_worker.py::test_a_non_json_return_value_does_not_run_the_task_again",)),
    Mutant("intent-key-random", "the provider's idempotency key and client reference are derived from the "
           "obligation, not random: a send repeated after a lost commit is one message", (
        Edit("operations/protocol.py",
             "                intent_key=intent_key(tenant=ctx.tenant, job_key=job.key, step=step, digest=digest),",
             "                intent_key=str(__import__('uuid').uuid4()),"),),
        ("tests/operations/test_lost_commit.py",)),
    Mutant("lookup-before-first-send", "a lookup-only provider so configured is asked before a first send", (
        Edit("operations/protocol.py", "        if _looks_up_before_first_send(connector):", "        if False:"),),
        ("tests/operations/test_lost_commit.py",)),
    Mutant("reminder-on-the-invoice", "an invoice already reminded (on its record) is not reminded again after "
           "retention deleted its job", (
        Edit("company/services.py", "    if invoice.reminded_at is not None:", "    if False:"),),
        ("tests/company/test_invoice_reminders.py::"
         "test_a_reminded_invoice_is_not_reminded_again_after_retention_deleted_its_job",)),
    Mutant("follow-up-on-the-quote", "a quote already followed up (on its record) is not followed up again", (
        Edit("company/handlers.py", "        if quote.followed_up_at is not None:", "        if False:"),),
        ("tests/company/test_quote_flow.py::"
         "test_a_followed_up_quote_is_not_followed_up_again_after_retention_deleted_the_follow_up_job",)),
    Mutant("task-return-normalized", "a task's return value is normalized as django-tasks does (bytes as text, "
           "tuples as lists)", (
        Edit("jobs/tasks_backend.py", "        stored = json.loads(json.dumps(normalize_json(value), allow_nan=False))",
             "        stored = json.loads(json.dumps(value, allow_nan=False))"),),
        (f"{TASKS_CONFORMANCE}/test_conformance_worker.py::test_a_return_value_is_normalized_as_django_tasks_does",)),
    Mutant("task-finished-exception", "a failed task's `task_finished` is sent while the task's own exception is "
           "handled (logger.exception reports it)", (
        Edit("jobs/tasks_backend.py", "        _while_handling(original, send)", "        send()"),),
        ("tests/jobs/test_tasks_backend.py::test_the_signals_are_sent_with_the_status_recorded_and_a_failure_is_logged_"
         "with_the_task_s_traceback",)),
    Mutant("idle-slot-waits", "an idle slot waits its poll interval between claims (an idle worker does not spin)", (
        Edit("jobs/worker.py", "                self._work.wait(chance.jittered(self.config.poll_interval))",
             "                self._work.wait(0.001)"),),
        ("tests/jobs/test_waiting_scale.py",)),
    Mutant("wake-due-index", "the wake-up sweep reads waits through their partial index (SQLite too)", (
        Edit("jobs/selectors.py",
             "    return (_jobs(jobs).filter(wake_at__isnull=False, wake_at__lte=at).extra(where=[_WAITING_WAKE_SQL])",
             '    return (_jobs(jobs).filter(wake_at__isnull=False, wake_at__lte=at, state__in=["WAITING_EXTERNAL", '
             '"WAITING_REVIEW"])'),),
        ("tests/jobs/test_waiting_scale.py",)),
    # Effects in doubt, decisions that strand nothing, bad input.
    Mutant("settle-before-business-check", "a reminder in doubt is reconciled before the invoice is re-checked", (
        Edit("company/handlers.py", '    sent = operation_settle(ctx, step="reminder")', "    sent = None"),),
        (f"{EFFECTS_IN_DOUBT}::test_a_reminder_accepted_but_unanswered_is_reported_sent_after_the_invoice_changed",)),
    Mutant("settle-follow-up", "a follow-up in doubt is reconciled before the quote is re-checked", (
        Edit("company/handlers.py", '    sent = operation_settle(ctx, step="follow-up")', "    sent = None"),),
        (f"{EFFECTS_IN_DOUBT}::test_a_follow_up_accepted_but_unanswered_is_reported_sent_after_the_quote_was_answered",)),
    Mutant("settle-miss-not-held", "a lookup miss before the business re-check records FAILED and sends nothing", (
        Edit("operations/protocol.py", "        if miss_means_not_held:", "        if False:"),),
        (f"{EFFECTS_IN_DOUBT}::test_a_reminder_the_provider_never_got_is_not_sent_and_its_operation_is_no_longer_in_doubt",)),
    Mutant("cancel-around-doubt", "cancelling a job whose operation is in doubt goes through the operation", (
        Edit("operations/apps.py", 'for ending in ("resolve", "cancel", "reject"):', 'for ending in ("resolve", "reject"):'),),
        (f"{DECISIONS_HARDENING}::test_cancelling_a_job_whose_operation_is_in_doubt_is_refused_and_nothing_changes",)),
    Mutant("seen-state-required", "a decision that does not say which state its person saw is refused", (
        Edit("review/decisions.py", "        raise DecisionRefused(_NOT_SEEN)", "        return", after="def check_seen("),),
        (f"{DECISIONS_HARDENING}::test_a_crafted_operation_decision_without_the_seen_state_is_refused",
         f"{DECISIONS_HARDENING}::test_every_decision_service_refuses_without_the_seen_state")),
    Mutant("note-maximum", "a note or evidence longer than the maximum is refused", (
        Edit("review/decisions.py", "    if len(text) > NOTE_MAX_CHARS:", "    if False:"),),
        (f"{DECISIONS_HARDENING}::test_a_note_of_several_pages_is_refused_and_nothing_is_stored",
         f"{DECISIONS_HARDENING}::test_evidence_of_several_pages_is_refused_on_every_decision_that_takes_it")),
    Mutant("strict-request-number", "a number from a request is ASCII digits (never a 500 on '²')", (
        Edit("durable/numbers.py", "        if not _WHOLE.fullmatch(text):", "        if not text.lstrip('-').isdigit():"),),
        (f"{DECISIONS_HARDENING}::test_a_decision_with_a_seen_state_that_is_not_an_event_id_is_refused_never_a_500",)),
    Mutant("finite-flag", "a numeric flag is finite (no run_worker --lease-ttl 1e999)", (
        Edit("durable/numbers.py", "    if not math.isfinite(value):", "    if False:"),),
        ("tests/test_command_flags.py::test_a_finite_number_is_finite_and_decimal",)),
    Mutant("redaction-referred-to", "redaction keeps what something live refers to, as deletion does", (
        Edit("jobs/retention.py", "        keep = _referred_to(candidates)", "        keep = set()", after="def _redact("),),
        ("tests/jobs/test_retention.py::test_redaction_keeps_the_bodies_something_live_still_refers_to",)),
    Mutant("redaction-leaves-due-for-deletion", "rows past retention deletion did not reach are not redacted", (
        Edit("jobs/retention.py", "            unredacted = unredacted.filter(finished_at__gte=retention_cutoff)",
             "            unredacted = unredacted"),),
        ("tests/jobs/test_retention.py::test_when_deletion_stops_at_its_batch_limit_redaction_leaves_the_rows_due_"
         "for_deletion",)),
    Mutant("retention-unbounded", "a sweep runs until its work runs out, not for a fixed number of batches", (
        Edit("jobs/retention.py", "        if self.max_batches is not None and self.batches >= self.max_batches:",
             "        if self.batches >= (self.max_batches or 200):"),),
        ("tests/jobs/test_retention.py::test_a_sweep_runs_past_the_old_cap_of_200_batches_until_the_work_runs_out",)),
    Mutant("partition-drop-rule", "a history partition is dropped only once no remaining job has history in it", (
        Edit("jobs/partitions.py", "    return cursor.fetchone()[0]", "    return 0", after="def _holds_remaining_history("),),
        ("tests/jobs/test_history_partitions.py::test_a_day_partition_is_dropped_only_once_no_remaining_job_has_"
         "history_in_it",), postgres=True),
    Mutant("resend-within-lease", "the resend backoff of a write in doubt is bounded by its lease", (
        Edit("jobs/worker.py", "        delay = min(delay, max(RESEND_MIN_DELAY, lease_left / 2))", "        delay = delay"),),
        ("tests/jobs/test_worker_writes.py::test_the_resend_backoff_never_outlasts_the_lease_whatever_the_outage",)),
    Mutant("heartbeat-together", "a heartbeat renews the leases a worker holds in one statement", (
        Edit("jobs/leases.py", "                renewed = self.store.renew_many(cfg.worker_id, [r.ctx.job for r in due], "
             "ttl=cfg.lease_ttl)", "                pass"),),
        ("tests/jobs/test_claim_batch.py::test_a_batch_worker_s_heartbeat_renews_the_leases_it_holds_together_not_one_by_one",)),
    Mutant("renewal-own-outcome", "a renewal that finds the job's own outcome is not a lost lease", (
        Edit("jobs/leases.py", "            if self.store.recorded_by(cfg.worker_id, [r.ctx.job], OUTCOME_KINDS):",
             "            if False:"),),
        ("tests/jobs/test_worker_writes.py::test_a_renewal_that_finds_the_jobs_own_outcome_is_not_a_lost_lease",)),
    Mutant("proposal-created-by-its-insert", "created is true only for the proposal whose insert made the job", (
        Edit("company/services.py", "            if not created:", "            if False:"),),
        ("tests/company/test_concurrent_proposals_pg.py::test_a_proposal_of_a_key_the_outbox_creates_at_the_same_"
         "moment_is_not_created",), postgres=True),
    Mutant("proposal-race-returns-winner", "a proposal racing another of its key returns the winner's job", (
        Edit("company/services.py", "        job = job_by_key(tenant=tenant.slug, key=job_key)", "        job = None",
             after="made this insert wait for it): its job is the one."),),
        ("tests/company/test_concurrent_proposals_pg.py::test_two_proposals_of_one_key_at_once_make_one_job_and_the_"
         "second_is_told_it_exists",), postgres=True),
    Mutant("auth-never-retries", "an authentication failure goes to an operator, never retried", (
        Edit("jobs/retry.py", "    if failure is Failure.AUTH:", "    if False:"),),
        ("tests/jobs/test_retry.py", "tests/jobs/test_worker.py::test_auth_error_is_never_attempted_twice",
         f"{PROTOCOL}::test_401_pauses_the_connector_for_that_tenant_and_provider_until_an_operator_clears_it")),
    Mutant("inbound-tenant-bound-first", "an event is filed under a tenant only if its provider is bound to it", (
        Edit("jobs/inbound.py",
             'tenant = message["tenant"] if message["tenant"] and _may_act_for(provider, message["tenant"]) else ""',
             'tenant = message["tenant"]'),),
        ("tests/jobs/test_inbound_bad_input_and_provider_binding.py",)),
    Mutant("task-name-registered", "a job runs only a @task declared on the backend, nothing it names is imported", (
        Edit("jobs/tasks_backend.py", "    return _declared.get(name)",
             "    return _declared.get(name) or __import__('django.utils.module_loading').utils.module_loading"
             ".import_string(name)"),),
        ("tests/jobs/test_tasks_backend.py::test_a_payload_naming_no_registered_task_is_refused_before_anything_is_imported",)),
    Mutant("company-admin-scope", "the company admin shows only the user's tenants", (
        Edit("company/admin.py", "    tenant_field = TENANT_FIELD", "    def get_queryset(self, request): return self.model.objects.all()"),),
        ("tests/company/test_admin_scope.py",)),
    Mutant("quote-approval-role", "approving a quote needs a reviewer's role in its tenant", (
        Edit("company/review.py", "        if refused:", "        if refused and False:"),),
        ("tests/company/test_admin_scope.py::test_approving_needs_the_permission_and_a_reviewers_role_each_on_its_own",)),
    Mutant("url-credentials-redacted", "a provider URL's credentials never reach what is stored or shown", (
        Edit("connectors/base.py", '        return _URL_USERINFO.sub(r"\\g<scheme>***@", value)', "        return value"),),
        ("tests/operations/test_provider_url_credentials.py",)),
    Mutant("probe-details-need-token", "an anonymous probe learns only ok or not ok", (
        Edit("jobs/monitoring.py", "    if _bearer_ok(request) or _staff_session(request):", "    if True:"),),
        ("tests/jobs/test_monitoring.py",)),
    # Fleet settings (DESIGN §17).
    Mutant("pooler-no-prepared-statements", "behind a transaction-mode pooler nothing is prepared", (
        Edit("durable/settings.py",
             '    DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": False, '
             '"prepare_threshold": None})',
             '    DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": True, '
             '"prepare_threshold": 2})'),),
        ("tests/test_pool_mode_settings.py::test_transaction_mode_prepares_nothing_and_holds_no_cursor",
         "tests/jobs/test_pooler_pg.py::test_workers_behind_a_transaction_pooler_run_every_job_once_and_wake_on_"
         "notify"), postgres=True),
    Mutant("pooler-refused-when-direct", "the direct configuration behind a transaction pooler refuses to start", (
        Edit("jobs/pooling.py", "    if first_pid != second_pid:", "    if True:"),),
        ("tests/jobs/test_pooler_pg.py::test_the_default_configuration_behind_a_transaction_pooler_refuses_to_"
         "start",), postgres=True),
    Mutant("connection-budget", "a worker LISTENs on its main connection: concurrency + 1 connections in all", (
        Edit("jobs/notify.py", "    return Listener(on_notify, url=url or None, alias=alias)",
             "    return Listener(on_notify, url=url or 'postgres://postgres@127.0.0.1:5432/' + "
             "connections[alias].settings_dict['NAME'], alias=alias)"),),
        ("tests/jobs/test_worker_connections_pg.py::test_a_worker_holds_at_most_concurrency_plus_one_connections_"
         "idle_or_busy",), postgres=True),
    # The agent gateway (DESIGN §15).
    Mutant("effect-limit-lock", "concurrent workers count an effect limit one at a time (the limit's row lock)", (
        Edit("operations/limits.py",
             "    limit = ActionLimit.objects.select_for_update().filter(tenant=job.tenant, action=job.action).first()",
             "    limit = ActionLimit.objects.filter(tenant=job.tenant, action=job.action).first()"),),
        ("tests/operations/test_limits.py::test_concurrent_workers_send_exactly_the_limit_and_the_rest_wait",),
        postgres=True),
    Mutant("effect-limit-checked", "a new intent over its tenant's effect limit waits instead of being sent", (
        Edit("operations/limits.py", "        if full_since is not None:", "        if False:"),),
        ("tests/operations/test_limits.py",)),
    Mutant("deferred-hands-back-attempt", "waiting on a limit or a pause uses up no attempt", (
        Edit("jobs/store.py", "                      hand_back_attempt=True, now=now)",
             "                      hand_back_attempt=False, now=now)"),),
        ("tests/jobs/test_worker.py::test_a_deferred_job_waits_with_its_reason_hands_its_attempt_back_and_runs_when_due",)),
    Mutant("handler-timed-when-it-raises", "a handler's duration is observed whether it returns or raises", (
        Edit("jobs/worker.py", "                observe(time.perf_counter() - started)",
             "                observe(time.perf_counter() - started) if \"outcome\" in locals() else None"),),
        ("tests/jobs/test_worker.py::test_a_handler_is_timed_whether_it_returns_or_raises",)),
    Mutant("paused-agent-holds", "a paused agent's jobs are held at dispatch", (
        Edit("gateway/services.py", "    if row is None or not row.agent.paused:", "    if True:"),),
        ("tests/gateway/test_acceptance.py::test_pausing_an_agent_holds_its_undispatched_jobs_and_resuming_sends_them_once",)),
    Mutant("key-revocation", "a revoked API key answers 401", (
        Edit("gateway/services.py",
             "    if key is None or key.revoked_at is not None or not secret_matches(secret, key.secret_hash):",
             "    if key is None or not secret_matches(secret, key.secret_hash):"),),
        ("tests/gateway/test_api.py::test_a_revoked_key_is_401_and_the_agents_other_keys_still_work",)),
    Mutant("mcp-http-key-checked", "/mcp answers a missing, malformed or revoked key 401 before MCP runs", (
        Edit("gateway/mcp_http.py",
             '            await with_database(agent_authenticate)(_authorization(scope["headers"]))',
             "            pass"),),
        ("tests/gateway/test_mcp_http.py::test_http_without_a_valid_key_is_refused_before_mcp_and_a_revoked_key_at_"
         "its_next_call",)),
    Mutant("key-secret-checked", "a key whose secret does not match its prefix's hash answers 401", (
        Edit("gateway/services.py",
             "    if key is None or key.revoked_at is not None or not secret_matches(secret, key.secret_hash):",
             "    if key is None or key.revoked_at is not None:"),),
        ("tests/gateway/test_api.py::test_a_known_prefix_with_another_secret_is_401",)),
    Mutant("proposal-conflict", "the same key with other content is a conflict, never the old proposal", (
        Edit("gateway/services.py", "    return job.action == action and original == payload", "    return True"),),
        ("tests/gateway/test_api.py::test_the_same_key_with_other_content_is_a_conflict_and_changes_nothing",)),
    Mutant("tenant-isolation", "another tenant's proposal reads 404", (
        Edit("gateway/services.py",
             '    own = (AgentProposal.objects.filter(agent=agent, job_key=key).select_related("proposal").first()',
             '    own = (AgentProposal.objects.filter(job_key=key).select_related("proposal").first()'),
        Edit("gateway/services.py",
             "    job = job_by_key(tenant=agent.tenant.slug, key=key) if own is not None else None",
             "    job = job_by_key(tenant=own.tenant, key=key) if own is not None else None")),
        ("tests/gateway/test_api.py::test_another_tenants_key_reads_404_never_403_and_cannot_touch_the_tenants_keys",)),
    Mutant("proposal-limit", "an agent over its proposal limit is refused 429", (
        Edit("gateway/services.py", "            refusal = proposal_limit_refusal(agent, timezone.now())",
             "            refusal = None"),),
        ("tests/gateway/test_api.py::test_over_the_per_minute_limit_is_429_with_retry_after_and_a_repeat_is_not_counted",)),
    Mutant("proposal-statements", "a new proposal reads nothing it cannot need (its view, its review clock)", (
        Edit("gateway/services.py", "    decided = None if fresh else last_decision(job.pk)",
             "    decided = last_decision(job.pk)"),
        Edit("review/due.py", "    deadline.save(force_insert=first)", "    deadline.save()")),
        ("tests/gateway/test_proposal_cost.py::test_a_new_proposal_costs_its_known_statements_and_no_more",)),
    Mutant("proposal-key-read-once", "a new proposal's key is read once, by the gateway under the agent's lock", (
        Edit("company/services.py", "                review=f\"proposed by {proposed_by}: {rationale}\" if needs_review else None, key_free=True,",
             "                review=f\"proposed by {proposed_by}: {rationale}\" if needs_review else None,"),),
        ("tests/gateway/test_proposal_cost.py::test_a_new_proposal_costs_its_known_statements_and_no_more",)),
    Mutant("proposal-view-fresh-only-when-new", "a proposal read again shows its decision", (
        Edit("gateway/services.py", "    return proposal_view(existing, mine.proposal), False",
             "    return proposal_view(existing, mine.proposal, fresh=True), False"),),
        ("tests/gateway/test_api.py::test_a_reviewers_correction_does_not_turn_the_agents_retry_into_a_conflict",)),
    Mutant("bench-reference-not-served", "the gateway bench's reference endpoint is mounted only by the bench's server", (
        Edit("durable/settings.py", 'ROOT_URLCONF = "durable.urls"', 'ROOT_URLCONF = "durable.urls_bench"'),),
        ("tests/proving/test_bench_gateway.py::test_the_reference_endpoint_is_not_served_by_the_site",)),
    Mutant("callback-once-per-event", "reading a proposal's history again makes no second callback", (
        Edit("gateway/callbacks.py", "                watched.events_seen = row.id", "                pass"),
         Edit("gateway/callbacks.py", '    return uuid.uuid5(EVENT_NAMESPACE, f"{tenant}\\n{key}\\n{history_id}\\n{type_}")',
              "    return uuid.uuid4()")),
        ("tests/gateway/test_callbacks.py::test_a_decision_and_the_outcome_reach_the_agent_signed_each_once",)),
    Mutant("bulk-seen-state", "a bulk decision is conditional on the state each item had in its preview", (
        Edit("review/bulk.py",
             "            changed = service(job_id=job_id, user=user, note=batch.note, seen_event=seen_event, batch=batch.pk)",
             "            changed = service(job_id=job_id, user=user, note=batch.note, batch=batch.pk, seen_event=JobEvent.objects"
             ".filter(job_id=job_id).order_by('-id').values_list('id', flat=True).first())"),),
        ("tests/console/test_queues.py::test_a_bulk_approve_decides_the_previewed_set_and_skips_an_item_that_moved",
         "tests/console/test_queues.py::test_bulk_retry_and_cancel_are_the_operators_and_obey_the_same_rules")),
    Mutant("bulk-tenant-scope", "a queue, its search and its bulk preview hold only the user's tenants", (
        Edit("console/queues.py", "    jobs = scope.filter(Job.objects.filter(state=state))",
             "    jobs = Job.objects.filter(state=state)"),),
        ("tests/console/test_queues.py::test_the_preview_holds_only_the_users_tenants_and_the_queues_state",
         "tests/console/test_queues.py::test_search_is_case_insensitive_over_key_recipient_subject_proposer_and_rationale")),
    Mutant("bulk-token-owner", "a bulk preview's token is taken only by the user it was issued to", (
        Edit("review/bulk.py", "        if batch is None or batch.user_id != user.pk:", "        if batch is None:"),),
        ("tests/console/test_queues.py::test_a_token_is_taken_once_and_only_by_its_user",)),
    Mutant("callback-address-checked", "a callback URL resolving to a non-public address is refused at delivery", (
        Edit("connectors/webhook.py", "            if problem:", "            if False:",
             after="        for address in addresses:"),),
        ("tests/gateway/test_callbacks.py::test_a_callback_address_is_checked_when_delivering_not_only_when_saved",
         "tests/connectors/test_webhook.py")),
    Mutant("system-keys-reserved", "no agent proposes a key in the namespace of the system's own jobs", (
        Edit("gateway/services.py", "    if system_key(proposal.key):", "    if False:"),),
        ("tests/gateway/test_walls.py::test_an_agent_cannot_squat_the_key_of_another_agents_callback_delivery",
         "tests/gateway/test_walls.py::test_the_keys_of_other_system_jobs_are_refused_too")),
    Mutant("agent-reads-own-proposals", "an agent reads its own proposals, not its tenant's other agents' or jobs", (
        Edit("gateway/services.py",
             '    own = (AgentProposal.objects.filter(agent=agent, job_key=key).select_related("proposal").first()',
             '    own = (AgentProposal.objects.filter(tenant=agent.tenant.slug, job_key=key).select_related("proposal")'
             '.first()'),),
        ("tests/gateway/test_walls.py::test_an_agent_reads_and_lists_only_its_own_proposals_not_its_tenants_other_agents",)),
    Mutant("repropose-only-own", "proposing another agent's key with its content again does not read it", (
        Edit("gateway/services.py",
             '    mine = AgentProposal.objects.filter(agent=agent, job_key=proposal.key).select_related("proposal").first()',
             '    mine = AgentProposal.objects.filter(tenant=tenant.slug, job_key=proposal.key).select_related("proposal")'
             '.first()'),),
        ("tests/gateway/test_walls.py::test_an_agent_reads_and_lists_only_its_own_proposals_not_its_tenants_other_agents",)),
    Mutant("api-body-too-large-problem", "a body past Django's own limit is 413 problem+json", (
        Edit("gateway/api.py", "    return problem_response(Refused(413, \"body-too-large\", "
             "f\"the body may be at most {max_body_bytes()} bytes\"))", "    raise exc"),),
        ("tests/gateway/test_walls.py::test_a_body_over_djangos_own_limit_is_413_problem_json",)),
    Mutant("api-unrouted-problem", "an unrouted path under the API is a problem+json 404", (
        Edit("gateway/api.py", '        return [*urls, re_path(r"^.*$", _unrouted, name="unrouted")]', "        return urls"),),
        ("tests/gateway/test_walls.py::test_an_unrouted_path_under_the_api_is_a_problem_404",)),
    Mutant("provider-known-at-proposal", "a payload naming an unknown provider is refused when proposed", (
        Edit("operations/handlers.py", "    if not provider_known(name):", "    if False:"),),
        ("tests/gateway/test_walls.py::test_a_proposal_naming_an_unknown_provider_is_refused_at_proposal",)),
    Mutant("email-subject-one-line", "an email subject holds no line break", (
        Edit("operations/handlers.py",
             '    subject: str = Field(title="Subject", min_length=1, max_length=200, pattern=LINE_PATTERN,',
             '    subject: str = Field(title="Subject", min_length=1, max_length=200, pattern=TEXT_PATTERN,'),),
        ("tests/gateway/test_walls.py::test_a_line_break_in_an_email_subject_is_refused",)),
    Mutant("callback-address-carried-ipv4", "an IPv6 address carrying a refused IPv4 address (6to4, Teredo) is refused", (
        Edit("connectors/webhook.py", "    carried = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]",
             "    carried = [ip.ipv4_mapped]"),),
        ("tests/gateway/test_walls.py::test_ipv6_addresses_that_embed_a_refused_ipv4_address_are_refused",)),
    Mutant("openapi-servers", "the OpenAPI paths are relative to the server the document names", (
        Edit("gateway/api.py", '        schema = super().get_openapi_schema(path_prefix="", path_params=path_params)',
             "        schema = super().get_openapi_schema(path_prefix=root, path_params=path_params)"),),
        ("tests/gateway/test_openapi_client.py::test_the_document_names_its_server_and_its_paths_are_relative_to_it",
         "tests/gateway/test_openapi_client.py::test_a_generated_client_proposes_reads_and_lists_with_the_readmes_base_url")),
    Mutant("openapi-payload-union", "each action's payload schema is tied to its action (a discriminated union)", (
        Edit("gateway/api.py", '            components.update(proposal_union(components["ProposalIn"], schema_actions()))',
             "            pass"),),
        ("tests/gateway/test_openapi_client.py::test_each_actions_payload_is_tied_to_its_action_by_a_discriminated_union",)),
    Mutant("gateway-time-format", "every time the gateway shows is RFC 3339 UTC with Z", (
        Edit("gateway/schemas.py", '    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")',
             "    return moment.isoformat()"),),
        ("tests/gateway/test_callbacks.py::test_the_guides_verification_accepts_a_delivered_callback_and_refuses_a_replay",
         "tests/gateway/test_openapi_client.py::test_a_generated_client_proposes_reads_and_lists_with_the_readmes_base_url")),
    Mutant("console-link-decision-page", "a proposal's links.console opens its decision page", (
        Edit("gateway/services.py", '"console": reverse("console:decide", args=[job.pk])}',
             '"console": reverse("admin:jobs_job_change", args=[job.pk])}'),),
        ("tests/gateway/test_callbacks.py::test_the_guides_verification_accepts_a_delivered_callback_and_refuses_a_replay",)),
    Mutant("email-recipient-format", "a recipient the document calls no email address is refused", (
        Edit("operations/handlers.py", "EMAIL_PATTERN = (r\"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-](?:[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]"
             "{0,62}[A-Za-z0-9!#$%&'*+/=?^_`{|}~-])?\"", "EMAIL_PATTERN = (r\"^[^@\\s]+\""),),
        ("tests/gateway/test_walls.py::test_a_recipient_is_an_email_address_as_the_document_says",
         "tests/gateway/test_api_schema.py")),
    Mutant("demo-leaves-agent-key", "make demo prints a usable agent key last and keeps it in a file", (
        Edit("company/management/commands/demo.py", "        w(key)", "        w(key[:15])"),),
        ("tests/company/test_demo.py::test_demo_story_sends_each_email_once_and_tells_what_happened",)),
    Mutant("correction-line-breaks", "a correction compares and stores a textarea's CRLF as LF", (
        Edit("review/decisions.py", '        return value.replace("\\r\\n", "\\n").replace("\\r", "\\n")', "        return value"),),
        ("tests/console/test_decision_page.py::test_a_correction_of_only_the_address_sent_with_crlf_records_no_body_change",
         "tests/console/test_decision_page.py::test_a_corrected_body_is_stored_with_lf_line_breaks")),
    Mutant("viewer-masking", "a viewer reads an action's sensitive fields masked", (
        Edit("jobs/access.py", "    return scope.role(tenant) in SEES_SENSITIVE", "    return True"),),
        ("tests/console/test_decision_page.py::test_a_viewer_reads_the_sensitive_fields_masked_and_those_who_decide_in_clear",)),
    Mutant("admin-offered-lookups", "an admin list filters only by what its page offers", (
        Edit("jobs/admin_scope.py", "        if unoffered:", "        if False:"),),
        ("tests/console/test_admin_offered_lookups.py",)),
    Mutant("masking-knows-corrections", "a viewer's masker knows every value a field held, corrections too", (
        Edit("review/masking.py", '    if getattr(job, "pk", None) is not None:', "    if False:"),),
        (f"{MASKING_EVERYWHERE}::test_a_corrected_address_quoted_by_the_provider_is_masked_on_every_page",)),
    Mutant("masking-any-letter-case", "a masked value is hidden in any letter case", (
        Edit("review/masking.py", ", re.IGNORECASE)", ")"),),
        (f"{MASKING_EVERYWHERE}::test_an_address_in_another_letter_case_or_inside_a_longer_value_is_masked",)),
    Mutant("masking-parts-of-a-value", "each address or word of a longer masked value is hidden on its own", (
        Edit("review/masking.py", "            hunted.update(_PARTS.split(value))", "            pass"),),
        (f"{MASKING_EVERYWHERE}::test_an_address_in_another_letter_case_or_inside_a_longer_value_is_masked",)),
    Mutant("masking-history-and-events", "a viewer reads History messages and operation events masked", (
        Edit("jobs/admin_scope.py", "        if masker:", "        if False:"),
        Edit("operations/admin.py", "        if self._masker is None or not self._masker.active:", "        if True:"),),
        (f"{MASKING_EVERYWHERE}::test_a_viewer_reads_an_operations_events_and_the_jobs_history_masked",)),
    Mutant("masking-business-records", "a viewer reads a proposal and a customer without the masked values", (
        Edit("company/admin.py", "        return [self.masked_fields.get(name, name) if masked else name for name in shown]",
             "        return shown"),),
        (f"{MASKING_EVERYWHERE}::test_a_viewer_reads_a_proposal_masked_and_cannot_find_it_by_its_rationale",
         f"{MASKING_EVERYWHERE}::test_a_viewer_sees_customers_by_name_never_their_address")),
    Mutant("masking-search-fields", "a viewer's search never matches a field they read masked", (
        Edit("jobs/admin_scope.py", "        if not masked or not term:", "        if True:"),),
        (f"{MASKING_EVERYWHERE}::test_a_viewer_reads_a_proposal_masked_and_cannot_find_it_by_its_rationale",
         f"{MASKING_EVERYWHERE}::test_a_viewer_sees_customers_by_name_never_their_address")),
    Mutant("redaction-clears-search-text", "a redacted job is not found by the payload it no longer holds", (
        Edit("jobs/retention.py", "        search_texts_redact(ids)", "        pass"),),
        ("tests/jobs/test_redaction_search.py",)),
    Mutant("batch-page-scope", "a batch that touched no tenant is its author's alone", (
        Edit("console/queues.py", "                             or (batch.tenants and all(scope.sees(t) for t in batch.tenants))):",
             "                             or all(scope.sees(t) for t in batch.tenants)):"),),
        ("tests/console/test_batch_scope.py",)),
    Mutant("evidence-required", "resolving with empty evidence is refused", (
        Edit("review/decisions.py", '    evidence = decision_text(evidence, what="evidence", missing=EVIDENCE_MISSING)',
             '    evidence = decision_text(evidence, what="evidence", required=False)'),),
        ("tests/console/test_decision_page.py::test_resolving_without_evidence_is_refused_and_the_page_keeps_the_note",)),
    Mutant("four-eyes-distinct-approvers", "a two-approval policy needs two different people", (
        Edit("review/decisions.py", "        if event.actor == username:", "        if False:"),),
        ("tests/console/test_review_policy.py",)),
    Mutant("four-eyes-approvals-required", "a payload is released only when the policy's number of people approved it",
           (Edit("review/decisions.py", "    required = max(1, review_terms(job).approvals)", "    required = 1"),),
           ("tests/test_system.py",)),
    Mutant("proposer-not-approver", "the proposer never approves their own proposal", (
        Edit("review/decisions.py", "    if proposer and proposer == username:", "    if False:"),),
        ("tests/console/test_review_policy.py",)),
    Mutant("review-round-per-stay", "each stay in review has rounds (and escalation keys) of its own", (
        Edit("review/due.py",
             "    stopped = ReviewDeadline.objects.filter(job_id=job.pk).update(due_at=None, overdue_at=None, reject_at=None)",
             "    stopped, _ = ReviewDeadline.objects.filter(job_id=job.pk).delete()"),),
        ("tests/console/test_review_clock_across_stays.py",)),
    Mutant("review-overdue-once", "an overdue step run again marks and tells nothing more and answers as before", (
        Edit("review/escalation.py", "            return job, deadline", "            return None",
             after="        if deadline.overdue_at is not None:"),),
        ("tests/console/test_review_clock_across_stays.py",)),
    Mutant("review-overdue-not-before-stay", "an overdue time is never before the stay in review began", (
        Edit("review/escalation.py", "max(at or deadline.due_at, deadline.entered_at)", "at or deadline.due_at"),),
        ("tests/console/test_review_clock_across_stays.py",)),
    Mutant("timer-reschedule-not-past", "an operator cannot reschedule a timer into the past", (
        Edit("review/decisions.py", "    if scheduled_for < db_now():", "    if False:"),),
        ("tests/console/test_review_clock_across_stays.py",)),
    Mutant("claim-time-under-lock", "a claim's time is read once it holds the lock (never before the write it waited for)", (
        Edit("jobs/store.py", "        # PostgreSQL: claim.py runs one statement (a short transaction with a",
             "        early = _claim_clock(now)"),
        Edit("jobs/store.py", "clock=_claim_clock(now), ttl=ttl, tenants=tenants,", "clock=early, ttl=ttl, tenants=tenants,"),),
        ("tests/console/test_timeline_order.py",)),
    Mutant("review-mail-reviewers-only", "review emails go to those who may review in the tenant, nobody else", (
        Edit("company/review_notify.py", '    return not access.refusal(user, "approve", tenant=tenant_slug)', "    return True"),),
        ("tests/company/test_review_recipients.py",)),
    Mutant("review-mail-recipient-at-send", "a review email's recipient is asked for when it is sent", (
        Edit("company/review_notify.py", '    user = reviewer_now(ctx.payload.get("user_id"), ctx.tenant)',
             '    user = get_user_model().objects.filter(pk=ctx.payload.get("user_id")).first()'),),
        ("tests/company/test_review_recipients.py::test_a_reviewer_demoted_after_the_digest_was_planned_gets_none",)),
    Mutant("four-eyes-correction-restarts", "a correction is the first approval of the payload it makes", (
        Edit("review/decisions.py", "    earlier = approvals_so_far(job) if required > 1 and not correcting else []",
             "    earlier = approvals_so_far(job) if required > 1 else []"),),
        (f"{FOUR_EYES}::test_the_second_approvers_correction_is_a_first_approval_of_the_new_payload",)),
    Mutant("four-eyes-before-correction", "approvals recorded before the newest correction do not count", (
        Edit("review/decisions.py", '        if event.kind == "correction":', "        if False:"),),
        (f"{FOUR_EYES}::test_the_second_approvers_correction_is_a_first_approval_of_the_new_payload",
         f"{FOUR_EYES}::test_a_correction_of_a_corrected_payload_restarts_again")),
    Mutant("four-eyes-current-stay", "only approvals of the current stay in review count", (
        Edit("review/decisions.py", "JobEvent.objects.filter(job_id=job.pk, id__gt=entered, kind__in=APPROVAL_KINDS)",
             "JobEvent.objects.filter(job_id=job.pk, kind__in=APPROVAL_KINDS)"),),
        (f"{FOUR_EYES}::test_a_first_approval_of_an_earlier_stay_does_not_count_in_the_next",)),
    Mutant("bulk-first-approvals-apart", "a bulk approve counts a first approval of two apart from decided", (
        Edit("review/bulk.py", "    return FIRST_APPROVAL if stayed else DECIDED", "    return DECIDED"),),
        (f"{BULK_CUT}::test_under_four_eyes_a_bulk_approve_reports_first_approvals_apart",)),
    Mutant("bulk-interrupted-item", "an item cut off by a database error leaves the batch interrupted, takeable", (
        Edit("review/bulk.py", "        except DatabaseError as exc:", "        except ZeroDivisionError as exc:"),),
        (f"{BULK_CUT}::test_a_deadlock_on_the_second_item_leaves_a_batch_that_says_so_and_is_taken_again",)),
    Mutant("bulk-progress-per-item", "a bulk decision records each item's outcome before the next", (
        Edit("review/bulk.py", "        _record(batch, outcome, final=False)", "        pass"),),
        (f"{BULK_CUT}::test_a_killed_request_leaves_the_decided_items_recorded_and_the_batch_takeable_once_it_stalled",)),
    Mutant("bulk-outcome-from-history", "a batch's outcome is read back from the histories naming it", (
        Edit("review/bulk.py", "        outcome[str(job_id)] = _taken(stayed=from_state == to_state)", "        pass"),),
        (f"{BULK_CUT}::test_an_item_decided_before_the_kill_recorded_it_is_reported_decided_not_moved",)),
    Mutant("quote-approval-under-send-policy", "a two-approver policy on company.send_quote holds an approved quote's email for a second reviewer", (
        Edit("company/review.py", "    if required > 1:", "    if False:", after="def quote_send_enqueue("),),
        ("tests/company/test_quote_four_eyes.py",)),
    Mutant("quote-approver-is-first-approval", "the quote's approver counts as the email's first approval", (
        Edit("company/review.py", "    if created and review is not None:", "    if False:"),),
        ("tests/company/test_quote_four_eyes.py::test_under_two_approvers_the_quote_approval_is_the_first_and_the_email_waits_for_a_second",)),
    Mutant("four-eyes-revoked-reviewer", "a reviewer whose role was revoked no longer counts", (
        Edit("review/decisions.py", '            if e.actor in approvers and access.may(approvers[e.actor], "approve", job)]',
             "            if e.actor in approvers]"),),
        (f"{FOUR_EYES}::test_a_revoked_reviewers_approval_does_not_count",)),
    Mutant("digest-once-per-period", "a reviewer's digest is keyed by the period, not by when it was planned", (
        Edit("company/review_notify.py", 'f"review-digests-{tenant.slug}-{start:%Y%m%dT%H%M%SZ}"',
             'f"review-digests-{tenant.slug}-{at:%Y%m%dT%H%M%S%fZ}"'),
        Edit("company/review_notify.py", "        key = review_digest_key(ctx.tenant, user.pk, start)",
             "        key = review_digest_key(ctx.tenant, user.pk, start) + ctx.worker_id"),),
        ("tests/company/test_review_digest.py",)),
    Mutant("hold-lifted-before-wait", "a pause lifted while the worker held the job leaves it READY, not waiting", (
        Edit("jobs/store.py", "            if deferred.held is not None and not deferred.held():", "            if False:"),),
        ("tests/operations/test_holds.py::test_a_pause_lifted_while_the_worker_holds_the_job_lets_it_go_on_at_once",)),
    Mutant("hold-release-locks-the-job", "a lifted pause resumes a job only while it still waits on that pause", (
        Edit("jobs/selectors.py", "    return Job.objects.select_for_update().by_key(tenant, key).first()",
             "    return Job.objects.by_key(tenant, key).first()"),),
        ("tests/operations/test_holds.py::"
         "test_a_job_moving_on_while_the_pause_is_lifted_is_never_resumed_from_its_new_wait",), postgres=True),
    Mutant("effect-limit-0-raised-releases", "an effect limit of 0 holds its jobs until it is raised, then resumes them", (
        Edit("operations/limits.py", "    if max_effects != 0:", "    if False:"),),
        ("tests/operations/test_limit_zero.py",)),
    Mutant("stop-cuts-a-starved-call", "a stop does not wait for a database call past the grace period", (
        Edit("jobs/worker.py", "                        if now - since >= limit and _cut(wrapper):", "                        if False:"),),
        ("tests/jobs/test_session_pool_starved_pg.py",), postgres=True),
    Mutant("chaos-survives-failover", "chaos reconnects when its database goes away", (
        Edit("proving/management/commands/chaos.py", "            except (OperationalError, InterfaceError) as exc:",
             "            except ZeroDivisionError as exc:"),),
        ("tests/proving/test_chaos_failover.py::test_chaos_survives_its_database_going_away_once",)),
    Mutant("chaos-no-orphans", "chaos never leaves a worker running, however it ends", (
        Edit("proving/management/commands/chaos.py", "                self._stop_children()", "                pass"),),
        ("tests/proving/test_chaos_failover.py::test_chaos_failing_leaves_no_worker_running",)),
    Mutant("proposal-limit-0-refuses", "a proposal limit of 0 refuses every proposal, with no retry time", (
        Edit("gateway/services.py", "        if limit == 0:", "        if False:"),),
        ("tests/gateway/test_proposal_limit_zero.py",)),
    Mutant("replica-writes", "with a standby for reads, every write goes to the primary", (
        Edit("durable/replica.py", "        return DEFAULT_DB_ALIAS", "        return REPLICA",
             after="    def db_for_write("),),
        (REPLICA_READS,), postgres=True),
    Mutant("replica-keys-on-primary", "with a standby for reads, an agent's API key is always read on the primary", (
        Edit("durable/replica.py", '    "gateway.agent", "gateway.apikey",', '    "gateway.agent",'),),
        (REPLICA_READS,), postgres=True),
    Mutant("replica-read-in-transaction", "a read inside a transaction on the primary is made on the primary", (
        Edit("durable/replica.py", "            and not connections[DEFAULT_DB_ALIAS].in_atomic_block)", "            )"),),
        (REPLICA_READS,), postgres=True),
]


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str
    seconds: float = 0.0
    detail: str = ""
    log: str = field(default="", repr=False)


class PatternNotFound(Exception):
    pass


def apply(tree: Path, mutant: Mutant) -> dict[Path, str]:
    """Apply the mutant's edits to `tree`; return the original texts to restore."""
    originals: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.path
        current = path.read_text()
        originals.setdefault(path, current)
        start = 0
        if edit.after:
            if current.count(edit.after) != 1:
                raise PatternNotFound(f"mutation {mutant.name}: anchor {edit.after.strip()!r} not found once in "
                                      f"{edit.path} (found {current.count(edit.after)} times)")
            start = current.index(edit.after) + len(edit.after)
        elif current.count(edit.old) != 1:
            raise PatternNotFound(f"mutation {mutant.name}: pattern not found once in {edit.path}: {edit.old.strip()!r} "
                                  f"(found {current.count(edit.old)} times)")
        at = current.find(edit.old, start)
        if at < 0:
            raise PatternNotFound(f"mutation {mutant.name}: pattern not found in {edit.path}: {edit.old.strip()!r}")
        if "\n" in edit.old or "\n" in edit.new:
            raise PatternNotFound(f"mutation {mutant.name}: an edit must stay on one line")
        path.write_text(current[:at] + edit.new + current[at + len(edit.old):])
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def run_tests(tree: Path, tests: tuple[str, ...] | list[str], env: dict[str, str]) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o",
               "addopts=--strict-markers", *tests]
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def copy_tree(destination: Path, name: str = "tree") -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "*.sqlite3*", "var", "staticfiles",
                                    ".hypothesis", ".pytest_cache", "*.egg-info")
    tree = destination / name
    shutil.copytree(ROOT, tree, ignore=ignore, symlinks=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="Run only these mutants (default: all).")
    parser.add_argument("--list", action="store_true", help="List the mutants and the tests that must catch each.")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MUTANTS_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/durable_mutants"),
        help="Database for the PostgreSQL-only mutants (its test_ database is created and dropped).")
    parser.add_argument("--skip-postgres", action="store_true",
                        help="Report the PostgreSQL-only mutants as skipped instead of running them.")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="Mutants tested at once, each in its own copy with its own test databases "
                             "(default: one per CPU).")
    options = parser.parse_args(argv)

    if options.list:
        for m in MUTANTS:
            print(f"{m.name:32} {'[postgres] ' if m.postgres else ''}{m.rule}\n{'':32} tests: {' '.join(m.tests)}")
        return 0
    unknown = set(options.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not options.names or m.name in options.names]

    started = time.monotonic()
    jobs = max(1, min(options.jobs, len(chosen)))
    with tempfile.TemporaryDirectory(prefix="durable-mutants-") as workdir:
        base_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HYPOTHESIS_PROFILE": "ci"}
        base_env.pop("DATABASE_URL", None)
        # One copy per job, each with its own SQLite file and its own PostgreSQL database.
        copies = []
        for number in range(jobs):
            tree = copy_tree(Path(workdir), f"tree{number}")
            env = {**base_env, "PYTHONPATH": str(tree)}
            sqlite_env = {**env, "SQLITE_TEST_DATABASE": str(Path(workdir) / f"test{number}.sqlite3")}
            pg_env = {**env, "DATABASE_URL": options.postgres_url + (f"_{number}" if number else "")}
            copies.append((tree, sqlite_env, pg_env))
        tree, sqlite_env, pg_env = copies[0]

        # Every mutant's pattern first: a changed line fails loudly before any test runs.
        problems = []
        for mutant in chosen:
            try:
                restore(apply(tree, mutant))
            except PatternNotFound as exc:
                problems.append(str(exc))
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1

        # The tests must pass on the unmutated copy, or a "kill" means nothing.
        for db, env, group in (("sqlite", sqlite_env, [m for m in chosen if not m.postgres]),
                               ("postgres", pg_env, [m for m in chosen if m.postgres and not options.skip_postgres])):
            tests = sorted({t for m in group for t in m.tests})
            if not tests:
                continue
            code, log = run_tests(tree, tests + (["--create-db"] if db == "postgres" else []), env)
            if code != 0:
                print(f"the tests do not pass on the unmutated tree ({db}); fix them first:\n{log[-4000:]}",
                      file=sys.stderr)
                return 1

        free = queue.Queue()
        for copy in copies:
            free.put(copy)
        printing = threading.Lock()

        def judge(mutant: Mutant) -> Outcome:
            if mutant.postgres and options.skip_postgres:
                return Outcome(mutant, "skipped", detail="needs PostgreSQL (--skip-postgres)")
            tree, sqlite_env, pg_env = free.get()
            try:
                originals = apply(tree, mutant)
                t0 = time.monotonic()
                try:
                    code, log = run_tests(tree, mutant.tests, pg_env if mutant.postgres else sqlite_env)
                finally:
                    restore(originals)
            finally:
                free.put((tree, sqlite_env, pg_env))
            seconds = time.monotonic() - t0
            if code == 1:
                failed = [line.split(" ", 1)[1].split(" - ")[0] for line in log.splitlines() if line.startswith("FAILED ")]
                outcome = Outcome(mutant, "killed", seconds, failed[0] if failed else "", log)
            elif code == 0:
                outcome = Outcome(mutant, "SURVIVED", seconds, "the tests still pass", log)
            else:
                outcome = Outcome(mutant, "ERROR", seconds, f"pytest exited {code}", log)
            with printing:
                print(f"  {outcome.verdict:8} {mutant.name}", file=sys.stderr, flush=True)
            return outcome

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(judge, chosen))

    width = max(len(o.mutant.name) for o in outcomes)
    print(f"\n{'mutant':{width}}  {'verdict':8}  {'time':>6}  caught by / why")
    for o in outcomes:
        print(f"{o.mutant.name:{width}}  {o.verdict:8}  {o.seconds:5.1f}s  {o.detail}")
    bad = [o for o in outcomes if o.verdict in ("SURVIVED", "ERROR")]
    killed = sum(o.verdict == "killed" for o in outcomes)
    print(f"\n{killed}/{len(outcomes)} killed, {len(bad)} survived or errored, "
          f"{sum(o.verdict == 'skipped' for o in outcomes)} skipped, in {time.monotonic() - started:.0f}s")
    for o in bad:
        print(f"\n--- {o.mutant.name} ({o.mutant.rule}): {o.detail}\n{o.log[-3000:]}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
