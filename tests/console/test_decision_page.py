"""The decision page without a browser: each
email action's preview is what its handler sends, the correction compares
and stores LF line breaks, resolving needs evidence, a viewer reads the
sensitive fields masked everywhere and a reviewer in clear."""

import json
from datetime import date
from decimal import Decimal

import pytest

from jobs.access import DecisionRefused
from jobs.actions import Preview, action_preview
from review import decisions
from review.masking import MASK
from tests.factories import OperationFactory

from .conftest import decide, make_job, newest_event

EMAIL = {"to": "ana-at-example.com", "subject": "Your quote 17", "body": "Dear Ana,\n\nhere it is.\n\nBest"}


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def test_a_correction_of_only_the_address_sent_with_crlf_records_no_body_change(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    client.force_login(people["reviewer"])
    response = decide(client, job, "correct", note="typo", **{
        "correct-to": "ana@example.com", "correct-subject": EMAIL["subject"], "correct-body": _crlf(EMAIL["body"])})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.events.last().detail["correction"] == {"to": {"before": "ana-at-example.com",
                                                             "after": "ana@example.com"}}
    assert job.payload["body"] == EMAIL["body"]


def test_a_corrected_body_is_stored_with_lf_line_breaks(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload={**EMAIL, "to": "a@example.com"})
    client.force_login(people["reviewer"])
    decide(client, job, "correct", note="longer", **{
        "correct-to": "a@example.com", "correct-subject": EMAIL["subject"], "correct-body": "Dear Ana,\r\n\r\nhere.\rBye"})
    job.refresh_from_db()
    assert job.payload["body"] == "Dear Ana,\n\nhere.\nBye"
    assert decisions.line_breaks_normalised("a\r\nb\rc\n") == "a\nb\nc\n"


def test_a_correction_with_only_crlf_changes_is_nothing_corrected(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload={**EMAIL, "to": "a@example.com"})
    with pytest.raises(DecisionRefused, match="nothing was corrected"):
        decisions.job_correct_and_approve(job_id=job.pk, user=people["reviewer"], note="x",
                                       seen_event=newest_event(job),
                                       data={"correct-to": "a@example.com", "correct-subject": EMAIL["subject"],
                                             "correct-body": _crlf(EMAIL["body"])})


@pytest.mark.parametrize("evidence", ["", "   ", "\n\t"])
def test_resolving_without_evidence_is_refused_and_the_page_keeps_the_note(client, people, evidence):
    job = make_job("invoice-9", "NEEDS_ATTENTION")
    with pytest.raises(DecisionRefused, match="evidence is required"):
        decisions.job_resolve(job_id=job.pk, user=people["operator"], note="sent by hand", evidence=evidence,
                           seen_event=newest_event(job))
    client.force_login(people["operator"])
    response = decide(client, job, "resolve", note="sent by hand", evidence=evidence)
    page = response.content.decode()
    assert response.status_code == 400 and "evidence is required" in page
    assert ">sent by hand</textarea>" in page
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION" and not job.events.filter(kind="resolve").exists()


def test_a_refused_correction_keeps_the_edits_and_puts_the_error_beside_the_field(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    client.force_login(people["reviewer"])
    response = decide(client, job, "correct", note="new address from the phone", **{
        "correct-to": "ana@nowhere", "correct-subject": "Changed subject", "correct-body": EMAIL["body"]})
    page = response.content.decode()
    assert response.status_code == 400
    assert 'value="ana@nowhere"' in page and 'value="Changed subject"' in page
    assert ">new address from the phone</textarea>" in page
    assert 'id="id_correct-to-error"' in page
    job.refresh_from_db()
    assert job.payload == EMAIL


def _viewer_and_reviewer_pages(client, people, job):
    pages = {}
    for role in ("viewer", "reviewer", "operator"):
        client.force_login(people[role])
        pages[role] = "".join(client.get(f"/admin/console/jobs/{job.pk}/{path}").content.decode()
                              for path in ("", "timeline/"))
        export = client.get(f"/admin/console/jobs/{job.pk}/history.json")
        pages[role] += b"".join(export.streaming_content).decode()
    return pages


def test_a_viewer_reads_the_sensitive_fields_masked_and_those_who_decide_in_clear(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    OperationFactory(job=job, request={**EMAIL, "body": "x"}, state="REJECTED",
                     last_error="550 ana-at-example.com: no such mailbox")
    decisions.job_correct_and_approve(job_id=job.pk, user=people["reviewer"], note="typo", seen_event=newest_event(job),
                                   data={"correct-to": "ana@example.com", "correct-subject": EMAIL["subject"],
                                         "correct-body": EMAIL["body"]})
    pages = _viewer_and_reviewer_pages(client, people, job)
    for address in ("ana-at-example.com", "ana@example.com"):
        assert address not in pages["viewer"]
        assert address in pages["reviewer"] and address in pages["operator"]
    assert MASK in pages["viewer"] and "Your quote 17" in pages["viewer"]  # only the sensitive field
    client.force_login(people["viewer"])
    export = json.loads(b"".join(client.get(f"/admin/console/jobs/{job.pk}/history.json").streaming_content))
    assert export["job"]["payload"]["to"] == MASK
    assert export["operations"][0]["request"]["to"] == MASK
    assert export["operations"][0]["last_error"] == f"550 {MASK}: no such mailbox"


def test_an_action_without_sensitive_fields_is_shown_to_a_viewer_as_it_is(client, people):
    job = make_job("q-1", "WAITING_REVIEW", payload={"to": "ana@example.com"})  # jobs.noop declares none
    client.force_login(people["viewer"])
    assert "ana@example.com" in client.get(f"/admin/console/jobs/{job.pk}/").content.decode()


# ---------------------------------------------------------------- each email action's preview


@pytest.fixture
def customer(tenants):
    from company.models import Tenant
    from company.services import customer_ensure

    return customer_ensure(tenant=Tenant.objects.get(slug="studio"), email="dave@example.com", name="Dave")


def _job_about(action, subject_type, subject_id, key):
    from jobs.store import Store

    return Store().enqueue("studio", key, action=action, subject_type=subject_type, subject_id=str(subject_id))


def test_a_quote_emails_preview_is_what_its_handler_sends(customer):
    from company.emails import quote_email, quote_follow_up_email
    from company.names import QUOTE, SEND_QUOTE, SEND_QUOTE_FOLLOW_UP
    from company.services import quote_approve, quote_create, quote_mark_sent

    quote = quote_create(tenant=customer.tenant, number="Q-7", customer=customer, amount=Decimal("900"))
    send = _job_about(SEND_QUOTE, QUOTE, quote.pk, "send-quote-Q-7")
    follow_up = _job_about(SEND_QUOTE_FOLLOW_UP, QUOTE, quote.pk, "quote-follow-up-Q-7")
    assert action_preview(send).summary.startswith("Sends nothing: quote Q-7 is DRAFT")
    quote = quote_approve(quote=quote, actor="rita")
    shown = {f.name: f.value for f in action_preview(send).fields}
    assert shown == quote_email(quote)
    assert "rendered again from the record" in action_preview(send).note
    assert action_preview(follow_up).summary.startswith("Sends nothing: quote Q-7 is APPROVED")
    quote = quote_mark_sent(quote=quote, actor="w1")
    assert {f.name: f.value for f in action_preview(follow_up).fields} == quote_follow_up_email(quote)


def test_an_invoice_reminders_preview_follows_the_record_and_says_when_nothing_is_sent(customer):
    from company.emails import invoice_reminder_email
    from company.names import INVOICE, SEND_INVOICE_REMINDER
    from company.services import customer_suppress, invoice_issue

    invoice = invoice_issue(tenant=customer.tenant, number="INV-9", customer=customer, amount=Decimal("50"),
                            due_date=date(2026, 11, 1), terms="net 30", actor="test")
    job = _job_about(SEND_INVOICE_REMINDER, INVOICE, invoice.pk, "invoice-reminder-INV-9")
    invoice.refresh_from_db()
    assert {f.name: f.value for f in action_preview(job).fields} == invoice_reminder_email(invoice)
    customer_suppress(customer=customer, reason="asked us to stop", actor="test")
    assert action_preview(job) == Preview(summary="Sends nothing: dave@example.com suppressed reminders "
                                                  "(asked us to stop).")


def test_a_recorded_request_is_previewed_as_recorded_whatever_the_record_says_now(customer):
    from company.names import INVOICE, SEND_INVOICE_REMINDER
    from company.services import invoice_issue, invoice_record_payment

    invoice = invoice_issue(tenant=customer.tenant, number="INV-9", customer=customer, amount=Decimal("50"),
                            due_date=date(2026, 11, 1), terms="net 30", actor="test")
    job = _job_about(SEND_INVOICE_REMINDER, INVOICE, invoice.pk, "invoice-reminder-INV-9")
    recorded = {"to": "dave@example.com", "subject": "Reminder: invoice INV-9", "body": "as first sent"}
    OperationFactory(job=job, step="reminder", request=recorded, state="UNKNOWN")
    invoice_record_payment(invoice=invoice, amount=Decimal("50"), actor="test")
    preview = action_preview(job)
    assert {f.name: f.value for f in preview.fields} == recorded
    assert "every retry sends exactly this request" in preview.note


def test_a_preview_that_fails_says_so_and_the_page_still_opens(client, people, monkeypatch):
    from jobs.actions import action_spec, _registry

    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    spec = action_spec("connectors.send_email")

    def broken(job):
        raise RuntimeError("the template is missing")

    from dataclasses import replace

    monkeypatch.setitem(_registry, "connectors.send_email", replace(spec, preview=broken))
    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "could not be rendered now: RuntimeError: the template is missing" in page


def test_an_ended_job_says_how_it_ended_with_the_rejection_note(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    decisions.job_reject(job_id=job.pk, user=people["reviewer"], note="duplicate of q-2", seen_event=newest_event(job))
    client.force_login(people["viewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "How it ended" in page and "rejection note: duplicate of q-2" in page
    assert "Why it waits" not in page and "Waiting for review</a>" not in page


def test_a_viewer_reads_the_job_record_in_the_admin_masked_too(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    client.force_login(people["viewer"])
    page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "ana-at-example.com" not in page and MASK in page and "Your quote 17" in page
    client.force_login(people["reviewer"])
    assert "ana-at-example.com" in client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()


def test_a_viewer_reads_an_operations_request_in_the_admin_masked(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    op = OperationFactory(job=job, request=EMAIL, state="REJECTED", last_error="550 ana-at-example.com unknown")
    client.force_login(people["viewer"])
    page = client.get(f"/admin/operations/operation/{op.pk}/change/").content.decode()
    assert "ana-at-example.com" not in page and MASK in page
    client.force_login(people["operator"])
    assert "ana-at-example.com" in client.get(f"/admin/operations/operation/{op.pk}/change/").content.decode()
