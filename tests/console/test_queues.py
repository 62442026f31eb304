"""The queues' search and filters, bulk decisions over a query and
assignment (DESIGN §16), without a browser."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group
from django.utils import timezone

from jobs.access import DecisionRefused
from jobs.models import DecisionBatch, Job, JobEvent
from jobs.store import Store
from review import bulk
from tests.factories import MembershipFactory

from .conftest import decide, make_job, newest_event

pytestmark = pytest.mark.django_db


def proposed(key, *, tenant="studio", to="dave@example.com", subject="Bulk reminder", by="agent:ada",
             rationale="the invoice is overdue", action="connectors.send_email"):
    job, _ = Store().enqueue_once(tenant, key, action=action, payload={"to": to, "subject": subject, "body": "Hi"},
                                  actor=by, reason=rationale, review=rationale,
                                  detail={"proposal": {"proposed_by": by, "rationale": rationale}})
    return job


def keys(response):
    return sorted(row["job"].key for row in response.context["rows"])


# ---------------------------------------------------------------- search and filters


def test_search_is_case_insensitive_over_key_recipient_subject_proposer_and_rationale(client, people):
    proposed("Invoice-Bulk-1", to="Dave@Example.com", subject="Second notice", by="agent:ada")
    proposed("other-2", to="erin@example.com", subject="Welcome", by="person:bob", rationale="new customer")
    proposed("bulk-acme", tenant="acme", to="dave@example.com")
    client.force_login(people["reviewer"])
    for term, expected in [("bulk", ["Invoice-Bulk-1"]), ("dave@example.com", ["Invoice-Bulk-1"]),
                           ("SECOND NOTICE", ["Invoice-Bulk-1"]), ("bob", ["other-2"]),
                           ("new cust", ["other-2"]), ("example.com", ["Invoice-Bulk-1", "other-2"]),
                           ("nowhere", [])]:
        assert keys(client.get("/admin/console/review/", {"q": term})) == expected, term


def test_a_search_term_too_short_for_the_index_is_refused_beside_the_form_and_not_applied(client, people):
    proposed("a-1")
    client.force_login(people["reviewer"])
    page = client.get("/admin/console/review/", {"q": "a"})
    assert keys(page) == ["a-1"]
    assert "search: write 3 to 200 characters" in page.content.decode()


def test_filters_by_proposer_action_age_and_assignee_and_pages_keep_them(client, people):
    for n in range(55):
        proposed(f"ada-{n:02}", by="agent:ada")
    proposed("bob-1", by="person:bob")
    Job.objects.filter(key="ada-00").update(updated_at=timezone.now() - timedelta(days=2))
    client.force_login(people["reviewer"])
    page = client.get("/admin/console/review/", {"proposer": "agent:ada"})
    assert page.context["page"].paginator.count == 55
    assert "proposer=agent%3Aada&amp;page=2" in page.content.decode()
    second = client.get("/admin/console/review/", {"proposer": "agent:ada", "page": 2})
    assert keys(second) == [f"ada-{n}" for n in range(50, 55)]
    assert keys(client.get("/admin/console/review/", {"proposer": "person:bob"})) == ["bob-1"]
    assert keys(client.get("/admin/console/review/", {"age": "1d"})) == ["ada-00"]
    assert "age: choose one of" in client.get("/admin/console/review/", {"age": "ages"}).content.decode()
    assert client.get("/admin/console/review/", {"action": "jobs.noop"}).context["rows"] == []
    client.post(f"/admin/console/jobs/{Job.objects.get(key='bob-1').pk}/assign/")
    assert keys(client.get("/admin/console/review/", {"assignee": "me"})) == ["bob-1"]
    assert "bob-1" not in keys(client.get("/admin/console/review/", {"assignee": "none"}))


def test_the_job_list_searches_the_same_text_any_case_within_the_users_tenants(client, people):
    proposed("Invoice-Bulk-1", to="dave@example.com")
    proposed("bulk-acme", tenant="acme", to="dave@example.com")
    client.force_login(people["reviewer"])
    page = client.get("/admin/jobs/job/", {"q": "DAVE@example"})
    assert [job.key for job in page.context["cl"].result_list] == ["Invoice-Bulk-1"]


def test_the_job_list_filters_by_proposer_and_age_and_offers_only_proposers_of_the_users_tenants(client, people):
    proposed("ada-1", by="agent:ada")
    proposed("bob-1", by="person:bob")
    proposed("acme-1", tenant="acme", by="agent:acme-only")
    Job.objects.filter(key="ada-1").update(updated_at=timezone.now() - timedelta(days=4))
    client.force_login(people["reviewer"])

    def listed(**query):
        return sorted(job.key for job in client.get("/admin/jobs/job/", query).context["cl"].result_list)

    assert listed(proposer="person:bob") == ["bob-1"]
    assert listed(proposer="agent:acme-only") == []
    assert listed(age="3d") == ["ada-1"]
    assert listed(age="3d", proposer="person:bob") == []
    page = client.get("/admin/jobs/job/").content.decode()
    assert "?proposer=agent%3Aada" in page and "?proposer=person%3Abob" in page
    assert "acme-only" not in page


def test_the_record_emails_are_found_by_their_recipient_and_subject(client, people, tenants):
    from datetime import date
    from decimal import Decimal

    from company.models import Customer, Invoice

    customer = Customer.objects.create(tenant=tenants[0], email="zoe@example.org", name="Zoe")
    invoice = Invoice.objects.create(tenant=tenants[0], number="INV-7", customer=customer, amount=Decimal("10"),
                                     balance=Decimal("10"), due_date=date(2026, 1, 1), terms="net 30")
    job, _ = Store().enqueue_once("studio", "reminder-1", action="company.send_invoice_reminder",
                                  subject_type="company.invoice", subject_id=str(invoice.pk), review="check")
    assert "zoe@example.org" in job.search_text and f"reminder: invoice {invoice.number}".casefold() in job.search_text


# ---------------------------------------------------------------- bulk decisions


def preview(client, queue="review", **filters):
    page = client.get(f"/admin/console/{queue}/bulk/", filters)
    assert page.status_code == 200, page.status_code
    return page.context["batch"], page


def take(client, batch, decision="approve", note="all checked", queue="review"):
    return client.post(f"/admin/console/{queue}/bulk/", {"token": batch.token, "decision": decision, "note": note})


def test_a_bulk_approve_decides_the_previewed_set_and_skips_an_item_that_moved(client, people):
    jobs = [proposed(f"bulk-{n:02}") for n in range(5)]
    proposed("other-1", subject="Unrelated")
    proposed("bulk-acme", tenant="acme")
    client.force_login(people["reviewer"])
    batch, page = preview(client, q="bulk")
    assert page.context["count"] == 5 and {j.key for j in page.context["sample"]} == {j.key for j in jobs}
    # Someone else decides one after the preview.
    decide(client, jobs[2], "reject", note="not this one")
    proposed("bulk-late")  # matches the query, but was not in the previewed set

    response = take(client, batch)

    assert response.status_code == 302 and response["Location"] == f"/admin/console/batches/{batch.pk}/"
    batch.refresh_from_db()
    assert (batch.decided, batch.skipped, batch.refused) == (4, 1, 0)
    assert batch.outcome[str(jobs[2].pk)].startswith("moved: already decided by rita")
    states = dict(Job.objects.values_list("key", "state"))
    assert [states[j.key] for j in jobs] == ["READY", "READY", "CANCELLED", "READY", "READY"]
    assert states["bulk-late"] == states["bulk-acme"] == states["other-1"] == "WAITING_REVIEW"
    approved = JobEvent.objects.get(job=jobs[0], kind="approve")
    assert (approved.actor, approved.reason, approved.detail["batch"]) == ("rita", "all checked", batch.pk)
    assert LogEntry.objects.filter(object_id=str(jobs[0].pk)).exists()
    # The timeline links the batch; the batch page tells the outcome.
    assert f"/admin/console/batches/{batch.pk}/" in client.get(f"/admin/console/jobs/{jobs[0].pk}/timeline/").content.decode()
    report = client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    assert "<strong>4</strong> decided, <strong>1</strong> skipped" in report and "first approval" not in report
    assert "<strong>1</strong> skipped" in report and "not decided" not in report


def test_a_token_is_taken_once_and_only_by_its_user(client, people, tenants):
    proposed("bulk-1")
    client.force_login(people["reviewer"])
    batch, _ = preview(client)
    second_reviewer = MembershipFactory(user__username="rosa", user__groups=[Group.objects.get(name="reviewers")],
                                        tenant=tenants[0], role="reviewer").user
    client.force_login(second_reviewer)
    take(client, batch)
    assert Job.objects.get(key="bulk-1").state == "WAITING_REVIEW"
    client.force_login(people["reviewer"])
    take(client, batch)
    assert Job.objects.get(key="bulk-1").state == "READY"
    with pytest.raises(DecisionRefused, match="already used"):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="again")


@pytest.mark.parametrize("decision,note,message", [("retry", "ok", "not a bulk decision"),
                                                   ("approve", "  ", "a note is required"),
                                                   ("approve", "x" * 5000, "at most 4000")])
def test_a_bad_bulk_post_decides_nothing_and_leaves_the_preview_usable(people, decision, note, message):
    proposed("bulk-1")
    batch, _ = bulk.batch_preview(user=people["reviewer"], queue="WAITING_REVIEW",
                                  jobs=Job.objects.filter(tenant="studio", state="WAITING_REVIEW"), query={})
    with pytest.raises(DecisionRefused, match=message):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision=decision, note=note)
    assert Job.objects.get(key="bulk-1").state == "WAITING_REVIEW"
    assert bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="ok").decided == 1


def test_the_preview_holds_only_the_users_tenants_and_the_queues_state(client, people):
    proposed("bulk-studio")
    proposed("bulk-acme", tenant="acme")
    make_job("bulk-attention", "NEEDS_ATTENTION")
    client.force_login(people["reviewer"])
    batch, page = preview(client)
    assert [job.key for job in page.context["sample"]] == ["bulk-studio"]
    assert batch.tenants == ["studio"] and len(batch.items) == 1


def crafted_batch(user, jobs, queue="WAITING_REVIEW"):
    """A batch whose set was not chosen by the preview's query (as a forged
    or stale set would be): the single-decision rules must still hold."""
    return DecisionBatch.objects.create(token=f"t-{user.pk}-{len(jobs)}", user=user, queue=queue,
                                        items=[[j.pk, newest_event(j)] for j in jobs], tenants=[])


@pytest.mark.parametrize("who,decision,expected", [
    # role × state × tenant: only the reviewer's own-tenant waiting item is decided.
    ("reviewer", "approve", {"studio-review": "decided", "studio-attention": "refused", "acme-review": "refused"}),
    ("reviewer", "reject", {"studio-review": "decided", "studio-attention": "refused", "acme-review": "refused"}),
    ("operator", "approve", {"studio-review": "refused", "studio-attention": "refused", "acme-review": "refused"}),
    ("viewer", "approve", {"studio-review": "refused", "studio-attention": "refused", "acme-review": "refused"}),
    ("reviewer-as-viewer", "approve", {"studio-review": "refused", "studio-attention": "refused",
                                       "acme-review": "refused"}),
])
def test_bulk_review_decisions_obey_every_rule_of_single_decisions(people, tenants, who, decision, expected):
    jobs = {"studio-review": proposed("studio-review"), "studio-attention": make_job("studio-attention",
                                                                                     "NEEDS_ATTENTION"),
            "acme-review": proposed("acme-review", tenant="acme")}
    if who == "reviewer-as-viewer":  # the permission, but only a viewer's role in the tenant
        user = MembershipFactory(user__username="val", user__groups=[Group.objects.get(name="reviewers")],
                                 tenant=tenants[0], role="viewer").user
    else:
        user = people[who]
    batch = bulk.batch_take(token=crafted_batch(user, list(jobs.values())).token, user=user, decision=decision,
                            note="crafted")
    got = {key: batch.outcome[str(job.pk)].split(":")[0] for key, job in jobs.items()}
    assert got == expected
    after = dict(Job.objects.values_list("key", "state"))
    assert after["studio-attention"] == "NEEDS_ATTENTION" and after["acme-review"] == "WAITING_REVIEW"
    assert batch.decided == list(expected.values()).count("decided")


def test_bulk_retry_and_cancel_are_the_operators_and_obey_the_same_rules(client, people):
    a, b = make_job("att-1", "NEEDS_ATTENTION"), make_job("att-2", "NEEDS_ATTENTION")
    review_item = proposed("review-1")
    client.force_login(people["reviewer"])
    assert client.get("/admin/console/attention/bulk/").status_code == 403
    assert client.post("/admin/console/attention/bulk/", {"token": "x", "decision": "retry"}).status_code == 403
    client.force_login(people["operator"])
    assert client.get("/admin/console/review/bulk/").status_code == 403
    batch, page = preview(client, queue="attention")
    assert page.context["count"] == 2
    decide(client, b, "cancel", note="by hand")
    take(client, batch, decision="retry", queue="attention")
    batch.refresh_from_db()
    assert (batch.decided, batch.skipped) == (1, 1)
    assert dict(Job.objects.values_list("key", "state")) == {"att-1": "READY", "att-2": "CANCELLED",
                                                             "review-1": "WAITING_REVIEW"}
    crafted = bulk.batch_take(token=crafted_batch(people["operator"], [review_item], queue="NEEDS_ATTENTION").token,
                              user=people["operator"], decision="cancel", note="crafted")
    assert crafted.refused == 1 and Job.objects.get(key="review-1").state == "WAITING_REVIEW"
    assert a.pk


def test_a_viewer_gets_no_bulk_preview(client, people):
    client.force_login(people["viewer"])
    assert client.get("/admin/console/review/bulk/").status_code == 403
    assert not DecisionBatch.objects.exists()


def test_a_larger_match_is_cut_to_the_oldest_bulk_max_and_the_preview_says_so(client, people, monkeypatch):
    monkeypatch.setattr(bulk, "BULK_MAX", 3)
    for n in range(5):
        proposed(f"bulk-{n}")
    client.force_login(people["reviewer"])
    batch, page = preview(client)
    assert [Job.objects.get(pk=i).key for i, _ in batch.items] == ["bulk-0", "bulk-1", "bulk-2"]
    assert "the oldest 3 of <strong>5</strong> matching" in page.content.decode()


# ---------------------------------------------------------------- assignment


def test_a_reviewer_takes_and_releases_an_item_each_recorded(client, people):
    job = proposed("item-1")
    client.force_login(people["reviewer"])
    client.post(f"/admin/console/jobs/{job.pk}/assign/")
    job.refresh_from_db()
    assert job.assignee == people["reviewer"] and job.state == "WAITING_REVIEW"
    assert JobEvent.objects.filter(job=job, kind="assign", actor="rita").exists()
    assert "Assigned to <strong id=\"assignee\">rita" in client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    client.post(f"/admin/console/jobs/{job.pk}/unassign/")
    job.refresh_from_db()
    assert job.assignee is None and JobEvent.objects.filter(job=job, kind="unassign").exists()


def test_only_operators_assign_others_and_only_to_people_who_may_decide_it(client, people, tenants):
    job = proposed("item-1")
    rosa = MembershipFactory(user__username="rosa", user__groups=[Group.objects.get(name="reviewers")],
                             tenant=tenants[0], role="reviewer").user
    client.force_login(people["reviewer"])
    client.post(f"/admin/console/jobs/{job.pk}/assign/", {"user": rosa.pk})
    job.refresh_from_db()
    assert job.assignee is None
    client.force_login(people["operator"])
    for refused in (people["other"], people["viewer"], people["operator"]):  # another tenant; no review role
        client.post(f"/admin/console/jobs/{job.pk}/assign/", {"user": refused.pk})
        job.refresh_from_db()
        assert job.assignee is None, refused
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert f'<option value="{rosa.pk}"' in page and f'<option value="{people["other"].pk}"' not in page
    client.post(f"/admin/console/jobs/{job.pk}/assign/", {"user": rosa.pk})
    job.refresh_from_db()
    assert job.assignee == rosa
    client.force_login(people["reviewer"])  # neither its assignee nor an operator
    client.post(f"/admin/console/jobs/{job.pk}/unassign/")
    job.refresh_from_db()
    assert job.assignee == rosa


def test_assignment_of_another_tenants_item_or_a_finished_one_is_refused(client, people):
    acme = proposed("acme-1", tenant="acme")
    done = make_job("done-1", "DONE")
    client.force_login(people["reviewer"])
    assert client.post(f"/admin/console/jobs/{acme.pk}/assign/").status_code == 404
    client.post(f"/admin/console/jobs/{done.pk}/assign/")
    client.force_login(people["viewer"])
    own = proposed("own-1")
    client.post(f"/admin/console/jobs/{own.pk}/assign/")
    assert not Job.objects.filter(assignee__isnull=False).exists()


def test_after_a_decision_the_next_item_of_the_same_queue_opens(client, people):
    first, second = proposed("bulk-1"), proposed("bulk-2")
    proposed("other-1", subject="Unrelated")
    client.force_login(people["reviewer"])
    queue = "/admin/console/review/?q=bulk"
    response = decide(client, first, "approve", next=queue)
    assert response["Location"] == f"/admin/console/jobs/{second.pk}/?next=%2Fadmin%2Fconsole%2Freview%2F%3Fq%3Dbulk"
    response = decide(client, second, "approve", next=queue)
    assert response["Location"] == queue
