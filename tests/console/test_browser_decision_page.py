"""The decision page as people use it, in Debian's Chromium: the effect of
approving is shown first, rendered from the records and exactly what is then
sent; the subject links to its record; a viewer reads sensitive fields
masked; an operator decides on an operation, line breaks survive a
correction, a refused correction keeps the edits, an ended job says how it
ended, and evidence and receipts are shown.

Set CONSOLE_SCREENSHOTS=<dir> to keep the screenshots taken here."""

import json
import re
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone
from django.contrib.auth.models import Group, Permission

from operations.models import Operation
from review.masking import MASK
from tests.factories import OperationFactory, ReceiptFactory
from tests.support import wait_for

from .conftest import CHROMIUM, decide_in_form, make_job, shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]

CONSOLE_DATE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def invoice_reminder_waiting_for_review(*, balance="480.00"):
    """An open invoice of studio and the agent's proposal to remind its
    customer, waiting for review (the path the rules agent takes)."""
    from company.models import Tenant
    from company.names import INVOICE, SEND_INVOICE_REMINDER, invoice_reminder_key
    from company.services import customer_ensure, invoice_issue, proposal_submit

    tenant = Tenant.objects.get(slug="studio")
    customer = customer_ensure(tenant=tenant, email="dave@example.com", name="Dave Example")
    invoice = invoice_issue(tenant=tenant, number="INV-0042", customer=customer, amount=Decimal(balance),
                            due_date=date(2026, 11, 1), terms="net 30", actor="test")
    submitted = proposal_submit(tenant=tenant, proposed_by="agent:rules", action=SEND_INVOICE_REMINDER,
                                job_key=invoice_reminder_key(invoice.number),
                                rationale="invoice INV-0042 is a month overdue", subject_type=INVOICE,
                                subject_id=invoice.pk, subject_version=invoice.version)
    assert submitted.job.state == "WAITING_REVIEW"
    return invoice, submitted.job


def preview_fields(page) -> dict[str, str]:
    section = page.locator("section.preview")
    labels = section.locator("dt").all_inner_texts()
    values = [dd.inner_text() for dd in section.locator("dd").all()]
    return dict(zip(labels, values, strict=True))


def document_order(page, first: str, second: str) -> bool:
    """Whether the element `first` comes before `second` in the page."""
    return page.evaluate(
        "([a, b]) => !!(document.querySelector(a).compareDocumentPosition(document.querySelector(b)) & 4)",
        [first, second])


def overflows(page) -> int:
    """By how many pixels the page, or a list in it that scrolls sideways on
    its own (the admin's `.results`), is wider than its box (0: it fits)."""
    return page.evaluate("""Math.max(...[document.documentElement, ...document.querySelectorAll('.results')]
                                      .map(e => e.scrollWidth - e.clientWidth))""")


# ---------------------------------------------------------------- the effect first


@pytest.mark.django_db(transaction=True)
def test_the_reviewer_sees_the_reminder_as_it_will_be_sent_first_and_approving_sends_exactly_that(
        login, live_server, manage, start_sim):
    from company.models import Invoice
    from company.services import invoice_record_payment

    invoice, job = invoice_reminder_waiting_for_review()
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_role("heading", name="What approving does").wait_for()
    shot(page, "preview-invoice-reminder")
    # The effect comes first: before why it waits and before the (empty) payload.
    assert document_order(page, "section.preview", "section.why")
    assert page.get_by_text("Sends this email through sim-idempotent, once.").is_visible()
    assert "rendered again from the record when it is sent" in page.locator(".preview-note").inner_text()
    shown = preview_fields(page)
    assert shown["Recipient address"] == "dave@example.com"
    assert shown["Subject"] == "Reminder: invoice INV-0042"
    assert "480.00 is still open" in shown["Message"]

    # Rendered now, from the record: a part payment changes the preview.
    invoice_record_payment(invoice=Invoice.objects.get(pk=invoice.pk), amount=Decimal("80.00"), actor="test")
    page.reload()
    shown = preview_fields(page)
    assert "400.00 is still open" in shown["Message"]

    # The subject is a link to the invoice the reviewer may see.
    page.get_by_role("link", name=f"company.invoice {invoice.pk}").click()
    page.wait_for_url(f"{live_server.url}/admin/company/invoice/{invoice.pk}/change/")
    page.go_back()

    decide_in_form(page, "Approve", "the customer asked for a reminder")
    page.get_by_text("is now READY").wait_for()
    sim = start_sim("idempotent")
    worker = manage.start("run_worker", "--until-idle", "--poll-interval", "0.1",
                          env={"PROVIDER_URL": sim.url, "PROVIDER_READ_TIMEOUT": "2", "PROVIDER_CONNECT_TIMEOUT": "1"})
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output
    sent = wait_for(sim.messages, what="the reminder at the provider")
    assert [(m["to"], m["subject"]) for m in sent] == [(shown["Recipient address"], shown["Subject"])]
    # The request the connector sent (its digest is what the provider
    # checked) is exactly what the page showed, to the character.
    request = Operation.objects.get(job=job).request
    assert request == {"to": shown["Recipient address"], "subject": shown["Subject"], "body": shown["Message"]}

    # Once sent, the page shows the recorded request and that a retry sends exactly it.
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    assert "every retry sends exactly this request" in page.locator(".preview-note").inner_text()


@pytest.mark.django_db(transaction=True)
def test_the_subject_is_plain_text_for_a_user_who_may_not_open_the_record(login, live_server, people):
    invoice, job = invoice_reminder_waiting_for_review()
    # A reviewer whose groups read jobs but not invoices.
    auditors = Group.objects.create(name="auditors")
    auditors.permissions.add(*Permission.objects.filter(codename__in=["view_job", "review_job", "view_jobevent"]))
    people["reviewer"].groups.set([auditors])
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_text(f"About: company.invoice {invoice.pk}").wait_for()
    assert page.get_by_role("link", name=f"company.invoice {invoice.pk}").count() == 0
    assert page.goto(f"{live_server.url}/admin/company/invoice/{invoice.pk}/change/").status == 403


@pytest.mark.django_db(transaction=True)
def test_a_paid_invoice_previews_that_approving_sends_nothing(login, live_server):
    from company.services import invoice_record_payment

    invoice, job = invoice_reminder_waiting_for_review()
    invoice_record_payment(invoice=invoice, amount=invoice.balance, actor="test")
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_text("Sends nothing: invoice INV-0042 is paid.").wait_for()
    assert page.locator("section.preview dt").count() == 0


# ---------------------------------------------------------------- masking


@pytest.mark.django_db(transaction=True)
def test_a_viewer_reads_the_recipient_masked_on_the_page_the_timeline_and_the_export(login, live_server, people):
    job = make_job("quote-email-3", "WAITING_REVIEW", action="connectors.send_email",
                   payload={"to": "ana-at-example.com", "subject": "Your quote 3", "body": "Dear Ana,\n\nhere it is."})
    OperationFactory(job=job, request={"to": "ana-at-example.com", "subject": "Your quote 3", "body": "x"},
                     state="REJECTED", last_error="550 the address ana-at-example.com does not exist")
    viewer = login("viewer")
    viewer.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    viewer.get_by_role("heading", name="What approving does").wait_for()
    shot(viewer, "masked-for-viewer")
    assert "ana-at-example.com" not in viewer.content()
    assert preview_fields(viewer)["Recipient address"] == MASK
    assert preview_fields(viewer)["Subject"] == "Your quote 3"  # only what the action marks sensitive
    viewer.get_by_text("fields this action marks sensitive are masked").wait_for()
    viewer.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/timeline/")
    assert "ana-at-example.com" not in viewer.content()
    export = viewer.request.get(f"{live_server.url}/admin/console/jobs/{job.pk}/history.json")
    assert export.status == 200 and "ana-at-example.com" not in export.text()
    assert json.loads(export.text())["job"]["payload"]["to"] == MASK

    # Whoever decides reads it in clear, everywhere.
    for role in ("reviewer", "operator"):
        page = login(role)
        page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
        assert preview_fields(page)["Recipient address"] == "ana-at-example.com"
        export = page.request.get(f"{live_server.url}/admin/console/jobs/{job.pk}/history.json")
        assert json.loads(export.text())["job"]["payload"]["to"] == "ana-at-example.com"


# ---------------------------------------------------------------- the operator's decision on an operation


@pytest.mark.django_db(transaction=True)
def test_every_control_on_an_operator_item_leads_somewhere_that_works(login, live_server):
    plain = make_job("invoice-9", "NEEDS_ATTENTION")
    job = make_job("reminder-7", "NEEDS_ATTENTION", action="connectors.send_email",
                   payload={"to": "ada@example.com", "subject": "Reminder", "body": "Hello,\n\nyour invoice."})
    op = OperationFactory(job=job, provider="sim-bare", request={**job.payload}, state="NEEDS_INVESTIGATION",
                          last_error="the provider did not answer in time", last_dispatched_at=timezone.now())
    page = login("operator")
    for item in (plain, job):
        page.goto(f"{live_server.url}/admin/console/jobs/{item.pk}/")
        # Every form posts to a URL that exists (a GET of a POST-only view answers 405, of a missing one 404).
        for action in page.locator("form[method=post]").evaluate_all("forms => forms.map(f => f.action)"):
            if "/admin/logout/" not in action:
                assert page.request.get(action).status == 405, action
        for href in page.locator("a.button").evaluate_all("links => links.map(a => a.href)"):
            assert page.request.get(href).status == 200, href
    page.goto(f"{live_server.url}/admin/console/jobs/{plain.pk}/")
    assert page.get_by_role("link", name="Decide what became of operation").count() == 0

    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_role("link", name="Decide what became of operation").click()
    page.wait_for_url(f"{live_server.url}/admin/operations/operation/{op.pk}/decide/")
    shot(page, "operation-decide")
    # Styled as the console, the request as fields, the console's date format.
    assert page.evaluate("getComputedStyle(document.querySelector('.console-decide .why')).borderLeftWidth") == "4px"
    request = page.locator("dl.request")
    # (PostgreSQL's jsonb keeps its own key order.)
    shown = dict(zip(request.locator("dt").all_inner_texts(), request.locator("dd").all_inner_texts(), strict=True))
    assert shown == {"to": "ada@example.com", "subject": "Reminder", "body": "Hello,\n\nyour invoice."}
    assert "{'to'" not in page.content()
    page.locator("details summary").click()
    assert json.loads(page.locator("details pre").inner_text())["to"] == "ada@example.com"
    assert CONSOLE_DATE.match(page.locator("dt:text-is('Last dispatched') + dd").inner_text())
    assert overflows(page) <= 0

    page.get_by_label("The provider holds it — record a receipt and resolve the job").check()
    page.get_by_label("Provider reference").fill("msg-77")
    page.get_by_label("Note").fill("in the provider's dashboard")
    page.get_by_role("button", name="Record decision").click()
    page.get_by_text("Recorded your decision").wait_for()
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state, op.receipt.provider_reference) == ("DONE", "ACCEPTED", "msg-77")


# ---------------------------------------------------------------- line breaks


def correct_in_browser(login, live_server, job, label, value, note):
    """A reviewer changes one field of the job's correction form and approves it."""
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    form = page.get_by_role("form", name="Correct and approve")
    form.get_by_label(label).fill(value)
    form.get_by_label("Note (required)").fill(note)
    form.get_by_role("button", name="Correct and approve").click()
    page.get_by_text("is now READY").wait_for()


@pytest.mark.django_db(transaction=True)
def test_correcting_only_the_address_records_no_body_change_and_keeps_the_bodys_line_breaks(login, live_server):
    body = "Dear Ana,\n\nplease find quote 17 attached.\n\nKind regards"
    job = make_job("quote-email-17", "WAITING_REVIEW", action="connectors.send_email",
                   payload={"to": "ana-at-example.com", "subject": "Your quote 17", "body": body})
    correct_in_browser(login, live_server, job, "Recipient address", "ana@example.com", "typo in the address")
    job.refresh_from_db()
    assert job.events.last().detail["correction"] == {"to": {"before": "ana-at-example.com",
                                                             "after": "ana@example.com"}}
    assert job.payload["body"] == body  # what the connector sends: LF, as before


@pytest.mark.django_db(transaction=True)
def test_a_corrected_body_is_stored_and_sent_with_lf_line_breaks(login, live_server):
    job = make_job("quote-email-18", "WAITING_REVIEW", action="connectors.send_email",
                   payload={"to": "ana@example.com", "subject": "Your quote 18", "body": "Dear Ana,\n\nhere."})
    correct_in_browser(login, live_server, job, "Message", "Dear Ana,\n\nhere is quote 18.\n\nBest",
                       "the quote number was missing")
    job.refresh_from_db()
    assert job.payload["body"] == "Dear Ana,\n\nhere is quote 18.\n\nBest"
    assert set(job.events.last().detail["correction"]) == {"body"}


# ---------------------------------------------------------------- a refused correction keeps the edits


@pytest.mark.django_db(transaction=True)
def test_a_refused_correction_shows_the_form_again_with_the_edits_the_note_and_the_error_beside_the_field(
        login, live_server):
    payload = {"to": "ana-at-example.com", "subject": "Your quote 17", "body": "Dear Ana,\n\nhere it is."}
    job = make_job("quote-email-17", "WAITING_REVIEW", action="connectors.send_email", payload=payload)
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    form = page.get_by_role("form", name="Correct and approve")
    form.get_by_label("Recipient address").fill("ana@example")  # the browser's check passes it
    form.get_by_label("Subject").fill("Your quote 17 (corrected)")
    form.get_by_label("Note (required)").fill("the customer gave a new address on the phone")
    form.get_by_role("button", name="Correct and approve").click()
    page.get_by_text("the correction is not valid: see the fields below").first.wait_for()
    shot(page, "refused-correction")
    form = page.get_by_role("form", name="Correct and approve")
    assert form.get_by_label("Recipient address").input_value() == "ana@example"
    assert form.get_by_label("Subject").input_value() == "Your quote 17 (corrected)"
    assert form.get_by_label("Note (required)").input_value() == "the customer gave a new address on the phone"
    # The error sits right after the field it is about.
    error = page.locator("#id_correct-to + .field-error")
    assert "Enter a valid email address" in error.inner_text()
    job.refresh_from_db()
    assert (job.state, job.payload) == ("WAITING_REVIEW", payload)

    # Fixing the one field and sending again works from the same page.
    form.get_by_label("Recipient address").fill("ana@example.com")
    form.get_by_role("button", name="Correct and approve").click()
    page.get_by_text("is now READY").wait_for()
    job.refresh_from_db()
    assert job.payload["to"] == "ana@example.com" and job.payload["subject"] == "Your quote 17 (corrected)"


# ---------------------------------------------------------------- an ended job says how it ended


@pytest.mark.django_db(transaction=True)
def test_a_rejected_or_done_job_says_how_it_ended_not_why_it_waits(login, live_server):
    rejected = make_job("quote-1", "WAITING_REVIEW")
    resolved = make_job("invoice-9", "NEEDS_ATTENTION")
    reviewer = login("reviewer")
    reviewer.goto(f"{live_server.url}/admin/console/jobs/{rejected.pk}/")
    decide_in_form(reviewer, "Reject", "duplicate of quote-2")
    reviewer.get_by_text("is now CANCELLED").wait_for()
    operator = login("operator")
    operator.goto(f"{live_server.url}/admin/console/jobs/{resolved.pk}/")
    form = operator.get_by_role("form", name="Resolve with evidence")
    form.get_by_label("Evidence (what you looked at)").fill("ticket #4411")
    decide_in_form(operator, "Resolve with evidence", "sent by hand")
    operator.get_by_text("is now DONE").wait_for()

    for page, job, said in ((reviewer, rejected, "rejection note: duplicate of quote-2"),
                            (operator, resolved, "sent by hand")):
        page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
        page.get_by_role("heading", name="How it ended").wait_for()
        shot(page, f"ended-{job.key}")
        assert page.get_by_text("Why it waits").count() == 0
        breadcrumbs = page.locator(".breadcrumbs").inner_text()
        assert "Waiting for review" not in breadcrumbs and "Needs attention" not in breadcrumbs
        assert said in page.locator("section.ending").inner_text()
        # The old reason is not repeated as if it still held.
        assert "the provider rejected the address" not in page.locator("#content-main > section").all_inner_texts()


# ---------------------------------------------------------------- evidence, receipts, the operation page


@pytest.mark.django_db(transaction=True)
def test_resolving_with_empty_evidence_is_refused_with_a_clear_error_and_keeps_the_note(login, live_server):
    job = make_job("invoice-9", "NEEDS_ATTENTION")
    page = login("operator")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    form = page.get_by_role("form", name="Resolve with evidence")
    form.get_by_label("Evidence (what you looked at)").fill("   ")  # passes the browser's `required`
    decide_in_form(page, "Resolve with evidence", "sent by hand")
    page.get_by_text("evidence is required: say what showed you it is done").first.wait_for()
    shot(page, "empty-evidence")
    form = page.get_by_role("form", name="Resolve with evidence")
    assert form.get_by_label("Note (required)").input_value() == "sent by hand"
    assert form.get_by_role("alert").inner_text().startswith("evidence is required")
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION" and not job.events.filter(kind="resolve").exists()


@pytest.mark.django_db(transaction=True)
def test_receipts_with_long_references_fit_a_1280_pixel_window(login, live_server):
    job = make_job("reminder-8", "NEEDS_ATTENTION", action="connectors.send_email",
                   payload={"to": "ada@example.com", "subject": "Reminder", "body": "Hello"})
    long_reference = "0100018c2f3e4a5b-" + "a1b2c3d4" * 12 + "-000000@email.eu-west-1.amazonses.com"
    for n in range(3):
        op = OperationFactory(job=job, step=f"send-r{n + 1}", state="ACCEPTED",
                              request={"to": "ada@example.com", "subject": "Reminder " * 20, "body": "Hello " * 200})
        # The widest date the admin writes ("Sept. 30, 2026, 12:59 p.m."): the
        # list must fit whatever the clock says when the test runs.
        ReceiptFactory(operation=op, provider_reference=f"{long_reference}-{n}", recorded_by="otto",
                       accepted_at=timezone.make_aware(datetime(2026, 9, 30, 12, 59)),
                       reason="found in the provider's dashboard " * 10,
                       evidence={"dashboard": "https://provider.example/messages/" + "x" * 200})
    page = login("operator")
    for path, name in (("/admin/operations/receipt/", "receipts-list"),
                       (f"/admin/operations/operation/{op.pk}/change/", "operation-with-receipt"),
                       (f"/admin/console/jobs/{job.pk}/", "decision-with-receipts"),
                       (f"/admin/console/jobs/{job.pk}/timeline/", "timeline-with-receipts")):
        assert page.goto(f"{live_server.url}{path}").status == 200
        shot(page, name)
        assert overflows(page) <= 0, f"{path} is {overflows(page)} px wider than the window"
