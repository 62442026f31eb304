"""The queues in Chromium: a reviewer searches by a
recipient in any case, approves 50 matching items at once while one of them
is decided by someone else meanwhile (49 decided, 1 skipped), takes an item
("assign to me"), finds it under "My items", and after deciding it the next
item of the same queue opens.

Set CONSOLE_SCREENSHOTS=<dir> to keep screenshots of the pages."""

import pytest

from jobs.models import DecisionBatch, Job
from jobs.store import Store
from review.decisions import job_reject

from . import test_browser as console_browser
from .conftest import newest_event, shot

# The browser and its sign-in are the console's fixtures (conftest).
pytestmark = [*console_browser.pytestmark, pytest.mark.django_db(transaction=True)]


def proposed(key, *, to="erin@example.com", subject="Reminder"):
    return Store().enqueue_once("studio", key, action="connectors.send_email",
                                payload={"to": to, "subject": subject, "body": "Hello"}, actor="agent:ada",
                                reason="the invoice is overdue", review="the invoice is overdue",
                                detail={"proposal": {"proposed_by": "agent:ada",
                                                     "rationale": "the invoice is overdue"}})[0]


def filter_queue(page, term):
    page.get_by_label("Search").fill(term)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_load_state()


def test_a_reviewer_finds_an_item_by_its_recipient_in_any_case(login, live_server):
    proposed("invoice-7", to="Dave@Example.com", subject="Second notice")
    proposed("invoice-8")
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/review/")
    filter_queue(page, "dave@EXAMPLE.com")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "invoice-7" in rows.first.inner_text()
    assert page.get_by_label("Search").input_value() == "dave@EXAMPLE.com"
    shot(page, "queue-search")
    filter_queue(page, "second NOTICE")
    assert page.locator("#result_list tbody tr").count() == 1


def test_a_bulk_approve_of_50_items_with_one_moved_meanwhile_decides_49_and_skips_1(login, live_server, people):
    jobs = [proposed(f"bulk-{n:02}") for n in range(50)]
    proposed("other-1", to="nobody@example.org", subject="Unrelated")
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/review/")
    filter_queue(page, "bulk-")
    page.get_by_role("link", name="Decide all matching items…").click()
    assert "50 items fixed for this decision" in page.locator("#bulk-count").inner_text()
    shot(page, "bulk-preview")
    # Someone decides one of them between the preview and the POST.
    moved = jobs[17]
    job_reject(job_id=moved.pk, user=people["reviewer"], note="not this one", seen_event=newest_event(moved))
    form = page.get_by_role("form", name="Bulk decision")
    form.get_by_label("Approve all 50").check()
    form.get_by_label("Note (required, recorded on every item)").fill("all fifty checked against the ledger")
    form.get_by_role("button", name="Decide 50 items").click()
    page.wait_for_url("**/admin/console/batches/*/")
    counts = page.locator("#batch-counts").inner_text()
    assert "49 decided, 1 skipped because they moved since the preview, 0 refused" in counts
    shot(page, "bulk-result")
    # Each job's tenant/key stays on one line (an inline link that wraps has several boxes).
    link = page.locator("#result_list tbody th a").first
    assert link.evaluate("a => a.getClientRects().length") == 1
    states = dict(Job.objects.filter(key__startswith="bulk-").values_list("key", "state"))
    assert list(states.values()).count("READY") == 49 and states[moved.key] == "CANCELLED"
    assert Job.objects.get(key="other-1").state == "WAITING_REVIEW"
    batch = DecisionBatch.objects.get()
    assert (batch.decided, batch.skipped) == (49, 1)
    # The job's timeline links the batch.
    page.goto(f"{live_server.url}/admin/console/jobs/{jobs[0].pk}/timeline/")
    page.locator(f"a[href='/admin/console/batches/{batch.pk}/']").first.click()
    page.wait_for_url(f"**/admin/console/batches/{batch.pk}/")


def test_a_reviewer_takes_an_item_finds_it_in_my_items_and_the_next_item_opens_after_deciding(login, live_server):
    first, second = proposed("item-1"), proposed("item-2")
    page = login("reviewer")
    page.goto(f"{live_server.url}/admin/console/review/")
    page.get_by_role("link", name="item-1").click()
    page.get_by_role("button", name="Assign to me").click()
    page.wait_for_load_state()
    assert page.locator("#assignee").inner_text() == "rita"
    shot(page, "assigned")
    page.goto(f"{live_server.url}/admin/console/review/")
    page.get_by_role("link", name="My items").click()
    page.wait_for_load_state()
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "item-1" in rows.first.inner_text() and "rita" in rows.first.inner_text()
    rows.first.get_by_role("link", name="item-1").click()
    page.wait_for_load_state()
    form = page.get_by_role("form", name="Approve", exact=True)
    form.get_by_label("Note (required)").fill("looks right")
    form.get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_load_state()
    # "My items" held only item-1: the queue it came from is empty now.
    assert page.url.endswith("/admin/console/review/?assignee=me")
    page.goto(f"{live_server.url}/admin/console/review/")
    page.get_by_role("link", name="item-2").click()
    page.wait_for_load_state()
    proposed("item-3")
    form = page.get_by_role("form", name="Approve", exact=True)
    form.get_by_label("Note (required)").fill("fine")
    form.get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_url(f"**/admin/console/jobs/{Job.objects.get(key='item-3').pk}/?next=*")
    assert Job.objects.get(pk=first.pk).state == Job.objects.get(pk=second.pk).state == "READY"
