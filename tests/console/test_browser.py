"""The console as people use it, in a real Chromium (Debian's, driven by
Playwright) against a live server: reviewers approve, reject and correct;
an operator resolves with evidence; a viewer sees no controls; a user of one
tenant gets 404 on another's job; the admin's stylesheet loads.

Set CONSOLE_SCREENSHOTS=<dir> to keep screenshots of the decision page and
the index's health panel."""

from pathlib import Path

import pytest

from jobs.models import Job
from operations.models import Operation
from tests.support import wait_for

from .conftest import CHROMIUM, decide_in_form, make_job, shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]


@pytest.mark.django_db(transaction=True)
def test_a_reviewer_approves_one_item_and_rejects_another_with_notes(login, live_server):
    first = make_job("quote-1", "WAITING_REVIEW")
    second = make_job("quote-2", "WAITING_REVIEW")
    page = login("reviewer")
    shot(page, "index-health")
    page.get_by_role("link", name="Waiting for review").click()
    page.get_by_role("link", name="quote-1").click()
    shot(page, "review-decision")
    decide_in_form(page, "Approve", "address checked with the customer")
    page.get_by_text("Approve: studio/quote-1 is now READY").wait_for()

    # The next item of the queue opens.
    page.wait_for_url(f"**/admin/console/jobs/{second.pk}/?next=*")
    decide_in_form(page, "Reject", "duplicate of quote-1")
    page.get_by_text("Reject: studio/quote-2 is now CANCELLED").wait_for()

    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == ("READY", "CANCELLED")
    assert first.events.last().reason == "address checked with the customer"
    assert (second.events.last().actor, second.events.last().reason) == ("rita", "duplicate of quote-1")


@pytest.mark.django_db(transaction=True)
def test_a_corrected_rejected_email_is_sent_once_to_the_corrected_address(login, live_server, manage, start_sim):
    from jobs.store import Store

    sim = start_sim("idempotent")
    env = {"PROVIDER_URL": sim.url, "PROVIDER_READ_TIMEOUT": "2", "PROVIDER_CONNECT_TIMEOUT": "1"}
    Store().enqueue("studio", "quote-email-17", action="connectors.send_email",
                    payload={"to": "ana-at-example.com", "subject": "Your quote 17", "body": "Dear Ana, here it is."})

    def run_worker():
        worker = manage.start("run_worker", "--until-idle", "--poll-interval", "0.1", env=env)
        output, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, output

    run_worker()
    job = Job.objects.get(key="quote-email-17")
    assert job.state == "WAITING_REVIEW" and sim.messages() == []
    rejected = Operation.objects.get(job=job)
    assert rejected.state == "REJECTED"

    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_text("rejected the request").wait_for()
    shot(page, "correct-decision")
    form = page.get_by_role("form", name="Correct and approve")
    form.get_by_label("Recipient address").fill("ana@example.com")
    form.get_by_label("Note (required)").fill("the customer's address had a typo")
    form.get_by_role("button", name="Correct and approve").click()
    page.get_by_text("is now READY").wait_for()

    run_worker()
    job.refresh_from_db()
    assert job.state == "DONE"
    messages = wait_for(sim.messages, what="the corrected email at the provider")
    assert [m["to"] for m in messages] == ["ana@example.com"]
    operations = {op.state: op for op in Operation.objects.filter(job=job)}
    assert set(operations) == {"REJECTED", "ACCEPTED"}  # the rejected one stays as evidence
    assert operations["ACCEPTED"].id != rejected.id and operations["ACCEPTED"].request["to"] == "ana@example.com"


@pytest.mark.django_db(transaction=True)
def test_an_operator_resolves_an_attention_item_with_evidence(login, live_server):
    job = make_job("invoice-9", "NEEDS_ATTENTION")
    page = login("operator")
    page.get_by_role("link", name="Need attention").click()
    page.get_by_text("401 from the provider").wait_for()
    page.get_by_role("link", name="invoice-9").click()
    form = page.get_by_role("form", name="Resolve with evidence")
    form.get_by_label("Evidence (what you looked at)").fill("ticket #4411: the provider sent it by hand")
    form.get_by_label("Note (required)").fill("sent manually by the provider's support")
    form.get_by_role("button", name="Resolve with evidence").click()
    page.get_by_text("is now DONE").wait_for()
    job.refresh_from_db()
    event = job.events.last()
    assert job.state == "DONE" and event.actor == "otto"
    assert event.detail["evidence"] == "ticket #4411: the provider sent it by hand"


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_no_decision_controls(login, live_server):
    job = make_job("quote-1", "WAITING_REVIEW")
    page = login("viewer")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_text("Why it waits").wait_for()
    assert page.locator("form textarea[name=note]").count() == 0
    assert page.get_by_role("button", name="Approve").count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_user_of_one_tenant_gets_404_on_another_tenants_job(login, live_server):
    job = make_job("secret-1", "WAITING_REVIEW", tenant="acme")
    page = login("reviewer")  # studio
    response = page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    assert response.status == 404
    response = page.goto(f"{live_server.url}/admin/jobs/job/{job.pk}/change/")
    assert response.status == 404


@pytest.mark.django_db(transaction=True)
def test_the_admin_stylesheet_loads(login, live_server):
    page = login("viewer")
    css = page.request.get(f"{live_server.url}/static/admin/css/base.css")
    assert css.status == 200
    # The stylesheet applied: the admin's header has its coloured background.
    background = page.evaluate("getComputedStyle(document.getElementById('header')).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")


CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""


@pytest.mark.django_db(transaction=True)
def test_the_admin_and_the_console_work_under_the_content_security_policy(login, live_server):
    from tests.factories import InboundEventFactory

    attention = make_job("invoice-9", "NEEDS_ATTENTION")
    InboundEventFactory(tenant="studio", event_id="evt-stray")
    InboundEventFactory(tenant="studio", event_id="evt-stray-2")
    page = login("operator")
    reported = []
    page.on("console", lambda message: reported.append(message.text)
            if "Content Security Policy" in message.text else None)
    page.add_init_script(CSP_WATCH)
    seen = []

    def visit(path, name):
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        shot(page, name)
        seen.extend(page.evaluate("window.__cspViolations"))

    visit("/admin/", "csp-index")
    page.get_by_text("Queue health").first.wait_for()
    # The navigation sidebar's toggle (admin/js/nav_sidebar.js) works.
    visit("/admin/jobs/job/", "csp-job-list")
    sidebar_open = page.evaluate("document.getElementById('main').classList.contains('shifted')")
    page.locator("#toggle-nav-sidebar").click()
    assert page.evaluate("document.getElementById('main').classList.contains('shifted')") != sidebar_open
    # The changelist's actions (admin/js/actions.js): select all, pick an action, run it.
    visit("/admin/jobs/inboundevent/", "csp-inbound-list")
    page.locator("#action-toggle").check()
    assert page.locator("input.action-select:checked").count() == 2
    page.get_by_text("2 of 2 selected").wait_for()
    page.locator("select[name=action]").select_option("resolve_inbound")
    page.get_by_role("button", name="Go").click()
    page.get_by_text("Mark unmatched events resolved: 2.").wait_for()
    seen.extend(page.evaluate("window.__cspViolations"))
    # A console decision page, its form, and the timeline.
    visit(f"/admin/console/jobs/{attention.pk}/", "csp-decision")
    # The console's stylesheet applied (it replaced the inline styles the policy blocks).
    assert page.evaluate("getComputedStyle(document.querySelector('.console-decide .why')).borderLeftWidth") == "4px"
    decide_in_form(page, "Retry now", "credentials rotated")
    page.get_by_text("is now READY").wait_for()
    seen.extend(page.evaluate("window.__cspViolations"))
    visit(f"/admin/console/jobs/{attention.pk}/timeline/", "csp-timeline")
    visit("/admin/console/attention/", "csp-attention")

    assert (seen, reported) == ([], [])


@pytest.mark.django_db(transaction=True)
def test_a_reviewer_approves_a_quote_of_their_tenant_and_never_sees_another_tenants(login, live_server):
    from decimal import Decimal

    from company.models import Quote
    from company.services import customer_ensure, quote_create, tenant_ensure

    def quote(slug, number):
        tenant = tenant_ensure(slug=slug)
        customer = customer_ensure(tenant=tenant, email=f"buyer@{slug}.example", name=f"Buyer of {slug}")
        return quote_create(tenant=tenant, number=number, customer=customer, amount=Decimal("1200"))

    mine, theirs = quote("studio", "Q-0100"), quote("acme", "Q-0200")
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/company/quote/")
    page.get_by_role("link", name="Q-0100").wait_for()
    assert page.get_by_text("Q-0200").count() == 0
    page.get_by_role("row", name="Q-0100").get_by_role("checkbox").check()
    page.locator("select[name=action]").select_option("approve")
    page.get_by_role("button", name="Go").click()
    page.get_by_text("Q-0100 approved; its email is queued").wait_for()
    shot(page, "company-quote-approved")
    assert Quote.objects.get(pk=mine.pk).status == "APPROVED"
    assert page.goto(f"{live_server.url}/admin/company/quote/{theirs.pk}/change/").status == 404
    assert Quote.objects.get(pk=theirs.pk).status == "DRAFT"


@pytest.mark.django_db(transaction=True)
def test_an_operator_cancels_a_job_in_doubt_through_its_operations_decision(login, live_server):
    from tests.factories import OperationFactory

    job = make_job("reminder-7", "NEEDS_ATTENTION", action="connectors.send_email",
                   payload={"to": "ada@example.com", "subject": "Reminder", "body": "Hello"})
    op = OperationFactory(job=job, provider="sim-bare", request=job.payload, state="NEEDS_INVESTIGATION")
    page = login("operator")
    page.goto(f"{live_server.url}/admin/console/jobs/{job.pk}/")
    page.get_by_text("Not offered now — Resolve with evidence, Cancel").wait_for()
    assert page.get_by_role("form", name="Cancel").count() == 0
    shot(page, "decision-in-doubt")
    page.get_by_role("link", name="Decide what became of operation").click()
    page.get_by_label("The provider does not hold it — cancel the job (nothing is sent)").check()
    page.get_by_label("Note").fill("not in the provider's log; the customer paid meanwhile")
    shot(page, "operation-decision")
    page.get_by_role("button", name="Record decision").click()
    page.get_by_text("Recorded your decision").wait_for()
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state) == ("CANCELLED", "FAILED")
