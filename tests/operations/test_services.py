"""Human decisions about operations, the digest, and the admin shells."""

import pytest

from jobs import interventions
from jobs.errors import InvalidTransition, NeedsAttention
from jobs.selectors import newest_event
from operations.digest import canonical_json, request_digest
from operations.errors import OperationStateError
from operations.models import Operation, OperationEvent, Receipt
from operations.selectors import connector_pause_active, operations_needing_investigation
from operations.services import connector_pause_clear, operation_confirm_not_accepted, operation_resolve_by_human
from tests.factories import ConnectorPauseFactory, MembershipFactory, TenantFactory, UserFactory

from .support import attempt, enqueue_email, job


# ---------------------------------------------------------------- digest


def test_digest_ignores_key_order_and_spacing_but_not_values():
    a = {"to": "ada@example.com", "subject": "Devis n°17 — été", "body": "x"}
    b = {"body": "x", "subject": "Devis n°17 — été", "to": "ada@example.com"}
    assert request_digest(a) == request_digest(b)
    assert request_digest(a) != request_digest({**a, "body": "y"})
    assert canonical_json(b) == '{"body":"x","subject":"Devis n°17 — été","to":"ada@example.com"}'.encode()
    assert len(request_digest(a)) == 64


def test_digest_refuses_what_json_cannot_represent():
    with pytest.raises(TypeError):
        request_digest({"when": object()})
    with pytest.raises(ValueError):
        request_digest({"amount": float("nan")})


# ---------------------------------------------------------------- an operation in doubt


@pytest.fixture
def in_doubt(store, start_sim, provider):
    """A bare provider's answer was lost: the job needs attention, the
    operation needs investigation, the provider holds one message."""
    sim = start_sim("bare", stall_after_accept=2)
    provider(sim, read_timeout=0.3)
    enqueue_email(store, mode="bare")
    assert isinstance(attempt(store), NeedsAttention)
    return sim


@pytest.mark.django_db
def test_a_human_receipt_records_who_and_why_and_resolves_the_job(in_doubt):
    op = Operation.objects.get()
    assert list(operations_needing_investigation(tenant="studio")) == [op]
    [message] = in_doubt.messages()

    receipt = operation_resolve_by_human(
        operation=op, actor="olga", provider_reference=message["id"],
        evidence={"dashboard": "message found, status delivered"}, reason="seen in the provider's dashboard",
    )

    op.refresh_from_db()
    assert (op.state, receipt.how, receipt.recorded_by) == ("ACCEPTED", "human", "olga")
    assert receipt.reason == "seen in the provider's dashboard"
    assert receipt.evidence == {"dashboard": "message found, status delivered"}
    assert job().state == "DONE"
    resolve = job().events.get(kind="resolve")
    assert resolve.actor == "olga" and resolve.detail["provider_reference"] == message["id"]
    assert OperationEvent.objects.filter(operation=op).last().kind == "human_receipt"
    assert not operations_needing_investigation().exists()


@pytest.mark.django_db
def test_a_human_receipt_with_continue_job_lets_the_handler_finish_without_sending(store, in_doubt):
    op = Operation.objects.get()
    operation_resolve_by_human(operation=op, actor="olga", provider_reference="msg_by_hand", evidence={},
                               reason="seen in the dashboard", continue_job=True)
    assert job().state == "READY"

    result = attempt(store)

    assert result["receipt"] == "human"
    assert job().state == "DONE"
    assert len(in_doubt.messages()) == 1


@pytest.mark.django_db
def test_a_human_cannot_resolve_while_a_worker_holds_the_job(store, in_doubt):
    op = Operation.objects.get()
    interventions.job_retry(tenant="studio", key="send-quote-017", reason="again", actor="ops")
    store.claim("studio", "send-quote-017", "w9", ttl=60)

    with pytest.raises(InvalidTransition):
        operation_resolve_by_human(operation=op, actor="olga", provider_reference="msg_x", evidence={},
                                   reason="seen")

    op.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION"
    assert not Receipt.objects.filter(operation=op).exists()


@pytest.mark.django_db
def test_confirming_nothing_was_sent_lets_the_next_attempt_send(store, in_doubt, start_sim, provider):
    op = Operation.objects.get()
    fresh = start_sim("bare", db_name="after.sqlite3")
    provider(fresh)

    operation_confirm_not_accepted(operation=op, actor="olga", reason="not in the provider's dashboard")

    op.refresh_from_db()
    assert op.state == "FAILED"
    assert job().state == "READY"
    attempt(store)
    op.refresh_from_db()
    assert (op.state, op.attempts, op.receipt.how) == ("ACCEPTED", 2, "direct")
    assert job().state == "DONE"

    with pytest.raises(OperationStateError):
        operation_confirm_not_accepted(operation=op, actor="olga", reason="changed my mind")


# ---------------------------------------------------------------- pauses and the admin


@pytest.mark.django_db
def test_clearing_a_pause_is_recorded_and_harmless_twice():
    ConnectorPauseFactory(provider="sim-idempotent")

    cleared = connector_pause_clear(tenant="studio", provider="sim-idempotent", actor="ops", reason="key rotated")

    assert cleared.cleared_by == "ops" and cleared.cleared_at is not None
    assert connector_pause_active(tenant="studio", provider="sim-idempotent") is None
    assert connector_pause_clear(tenant="studio", provider="sim-idempotent", actor="ops") is None


@pytest.mark.django_db
def test_admin_shows_operations_read_only_and_clears_pauses(admin_client, in_doubt):
    op = Operation.objects.get()
    operation_resolve_by_human(operation=op, actor="olga", provider_reference="msg_by_hand", evidence={},
                               reason="seen in the dashboard")
    pause = ConnectorPauseFactory(provider="sim-bare", status_code=403)

    listing = admin_client.get("/admin/operations/operation/")
    page = admin_client.get(f"/admin/operations/operation/{op.pk}/change/")
    receipts = admin_client.get("/admin/operations/receipt/")
    cleared = admin_client.post(f"/admin/operations/connectorpause/{pause.pk}/clear/",
                                {"note": "credentials rotated"}, follow=True)

    assert listing.status_code == page.status_code == receipts.status_code == 200
    body = page.content.decode()
    assert "msg_by_hand" in body and "human_receipt" in body and "Save" not in body
    assert cleared.status_code == 200
    pause.refresh_from_db()
    assert pause.cleared_by == "admin"


@pytest.mark.django_db
def test_operator_decides_an_operation_in_doubt_in_the_admin(admin_client, in_doubt):
    op = Operation.objects.get()
    page = admin_client.get(f"/admin/operations/operation/{op.pk}/change/")
    assert "Decide what became of it" in page.content.decode()
    form = admin_client.get(f"/admin/operations/operation/{op.pk}/decide/")
    assert form.status_code == 200 and str(op.id) in form.content.decode()

    missing = admin_client.post(f"/admin/operations/operation/{op.pk}/decide/",
                                {"decision": "sent", "reason": "seen it"})
    assert "A receipt needs the provider&#x27;s reference." in missing.content.decode()
    op.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION"

    [message] = in_doubt.messages()
    done = admin_client.post(f"/admin/operations/operation/{op.pk}/decide/",
                             {"decision": "sent", "provider_reference": message["id"], "reason": "in the dashboard",
                              "evidence": "status: delivered", "seen_event": newest_event(op.job_id).id})
    assert done.status_code == 302
    op.refresh_from_db()
    assert (op.state, op.receipt.how, op.receipt.recorded_by) == ("ACCEPTED", "human", "admin")
    assert op.receipt.evidence == {"note": "status: delivered"}
    assert job().state == "DONE"


@pytest.mark.django_db
def test_staff_without_the_operator_permission_cannot_decide(client, in_doubt):
    viewer = UserFactory(username="viewer", staff=True)
    MembershipFactory(user=viewer, tenant=TenantFactory(slug="studio"), role="viewer")
    client.force_login(viewer)
    op = Operation.objects.get()
    assert client.post(f"/admin/operations/operation/{op.pk}/decide/",
                       {"decision": "not_sent", "reason": "x"}).status_code == 403
    op.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION"
