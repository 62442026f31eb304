"""Proposals of one business key at the same moment, on real parallel
PostgreSQL connections: the second waits for the first
and gets its job — never an IntegrityError —, `created` is true only for the
caller whose proposal made the job (not when the outbox or a timer created
that key meanwhile), and two `seed_demo` runs on one tenant both succeed
with the same end state as one. The race is made certain, not hoped for:
the first writer holds its transaction open until the second is seen
waiting on its lock."""

import threading

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from company.models import Customer, Invoice, Proposal, Quote
from company.services import proposal_submit, tenant_ensure
from jobs.models import Job, OutboxEvent
from jobs.store import Store
from tests.support import held_open, in_processes, in_thread, wait_for, waiting_on_locks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TENANT = "acme"
KEY = "invoice-reminder-INV-7"


def propose(tenant, proposed_by: str):
    return proposal_submit(tenant=tenant, proposed_by=proposed_by, action="company.send_invoice_reminder",
                           job_key=KEY, rationale="invoice INV-7 is overdue")


def test_two_proposals_of_one_key_at_once_make_one_job_and_the_second_is_told_it_exists():
    tenant = tenant_ensure(slug=TENANT)

    with held_open(lambda: propose(tenant, "agent:rules run 1")) as first:
        second, outcome = in_thread(lambda: propose(tenant, "agent:rules run 2"))
    second.join(60)

    assert "error" not in outcome, f"the second proposal raised {outcome.get('error')!r}"
    assert first["result"].created is True and outcome["result"].created is False
    assert outcome["result"].job.pk == first["result"].job.pk
    assert Proposal.objects.get().proposed_by == "agent:rules run 1"
    assert Job.objects.filter(key=KEY).count() == 1


def test_a_proposal_of_a_key_the_outbox_creates_at_the_same_moment_is_not_created():
    tenant = tenant_ensure(slug=TENANT)

    def outbox_enqueues():
        return Store().enqueue(TENANT, KEY, action="company.send_invoice_reminder", actor="outbox:17",
                               reason="invoice INV-7 reminder is due")

    with held_open(outbox_enqueues) as outbox:
        proposing, outcome = in_thread(lambda: propose(tenant, "agent:rules"))
    proposing.join(60)

    assert "error" not in outcome, f"the proposal raised {outcome.get('error')!r}"
    submitted = outcome["result"]
    assert submitted.created is False and submitted.proposal is None
    assert submitted.job.pk == outbox["result"].pk
    # The job is the outbox's: no proposal row claims it, its creation names no proposal.
    assert not Proposal.objects.exists()
    created = Job.objects.get(key=KEY).events.get(kind="enqueue")
    assert created.actor == "outbox:17" and "proposal" not in created.detail


def seed(_):
    call_command("seed_demo", "--tenant", TENANT, "--quotes", "3", "--invoices", "3")
    return "seeded"


@pytest.mark.parametrize("table", ["company_invoice", "company_quote"])
def test_two_seed_demo_runs_at_once_on_one_tenant_both_succeed_with_one_runs_end_state(table):
    tenant_ensure(slug=TENANT)  # both runs then race for each invoice and quote
    lock_held, release = threading.Event(), threading.Event()

    def lock_table():
        # Both runs see the number free, then wait at its insert: the race
        # on one invoice (or quote) number, made certain.
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            lock_held.set()
            release.wait(60)
        connection.close()

    holder = threading.Thread(target=lock_table)
    holder.start()
    assert lock_held.wait(30)
    def release_once_both_wait():
        try:
            wait_for(lambda: waiting_on_locks() >= 2, timeout=60, what="both runs at the insert")
        finally:
            release.set()
            connection.close()

    releaser = threading.Thread(target=release_once_both_wait)
    releaser.start()
    try:
        results = in_processes(seed, [(1,), (2,)])
    finally:
        release.set()
        releaser.join(60)
        holder.join(60)

    assert results == [("ok", "seeded"), ("ok", "seeded")]
    assert sorted(Quote.objects.values_list("number", "status")) == [
        ("Q-0001", "APPROVED"), ("Q-0002", "APPROVED"), ("Q-0003", "APPROVED")]
    assert Invoice.objects.filter(tenant__slug=TENANT).count() == 3
    assert Customer.objects.filter(tenant__slug=TENANT).count() == 6
    assert OutboxEvent.objects.filter(event_type="quote.approved").count() == 3
    assert OutboxEvent.objects.filter(event_type="invoice.issued").count() == 3
