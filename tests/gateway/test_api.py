"""The HTTP API of DESIGN §15 as an agent uses it: statuses, bodies, problem
details, idempotency by business key, tenant isolation, the tenant's policy."""

import json
import logging

import pytest
from django.contrib.admin.models import LogEntry

from company.models import Proposal
from company.services import tenant_ensure, tenant_policy_set
from gateway.models import AgentProposal
from gateway.services import agent_create, agent_key_issue, agent_key_revoke, agent_pause, agent_unpause
from jobs import interventions
from jobs.models import Job, JobEvent
from jobs.selectors import newest_event
from operations.limits import action_pause, action_resume
from review.decisions import job_correct_and_approve

from .conftest import EMAIL

PROBLEM = "application/problem+json"


def problem(response, status):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    document = response.json()
    assert document["status"] == status and document["title"] and document["detail"] and document["type"]
    return document


def test_actions_list_the_agents_actions_with_the_tenants_review_policy_and_payload_schemas(api, tenant):
    tenant_policy_set(tenant=tenant, runs_without_review=["company.send_quote"])
    actions = {a["name"]: a for a in api.get("/actions").json()}
    assert set(actions) == {"connectors.send_email", "company.send_quote", "company.send_quote_follow_up",
                            "company.send_invoice_reminder"}
    assert actions["company.send_quote"]["needs_review"] is False
    assert actions["connectors.send_email"]["needs_review"] is True
    email = actions["connectors.send_email"]["payload_schema"]
    assert email["required"] == ["to", "subject", "body"] and email["additionalProperties"] is False
    assert actions["connectors.send_email"]["description"]


def test_an_agent_limited_to_some_actions_sees_only_those_and_may_propose_no_other(client, tenant):
    agent, issued = agent_create(tenant=tenant, name="mailer", actor="t", actions=["connectors.send_email"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {issued.key}"}
    assert [a["name"] for a in client.get("/api/v1/actions", **auth).json()] == ["connectors.send_email"]
    refused = client.post("/api/v1/proposals", {"action": "company.send_quote", "key": "q-1", "rationale": "r"},
                          content_type="application/json", **auth)
    problem(refused, 403)
    assert not Job.objects.exists()


def test_a_proposal_is_created_once_and_the_same_content_again_answers_200(api):
    first = api.propose("send-1")
    assert first.status_code == 201
    body = first.json()
    assert body["created"] is True and body["key"] == "send-1" and body["action"] == "connectors.send_email"
    assert body["state"] == "WAITING_REVIEW" and body["needs_review"] is True
    assert body["decision"] is None and body["outcome"] is None
    assert body["links"]["self"] == "/api/v1/proposals/send-1"
    again = api.propose("send-1", rationale="asked again")
    assert again.status_code == 200 and again.json()["created"] is False
    assert Job.objects.count() == 1 and Proposal.objects.count() == 1 and AgentProposal.objects.count() == 1


def test_the_same_key_with_other_content_is_a_conflict_and_changes_nothing(api):
    api.propose("send-1")
    problem(api.propose("send-1", payload={**EMAIL, "subject": "Something else"}), 409)
    problem(api.propose("send-1", action="company.send_quote", payload={}), 409)
    job = Job.objects.get()
    assert job.payload["subject"] == EMAIL["subject"]


def test_a_reviewers_correction_does_not_turn_the_agents_retry_into_a_conflict(api, django_user_model, tenant):
    from company.models import Membership
    from django.contrib.auth.models import Group

    api.propose("send-1")
    job = Job.objects.get()
    reviewer = django_user_model.objects.create_user("rita", password="x" * 12, is_staff=True)
    reviewer.groups.add(Group.objects.get(name="reviewers"))
    Membership.objects.create(user=reviewer, tenant=tenant, role="reviewer")
    job_correct_and_approve(job_id=job.pk, user=reviewer, note="typo", seen_event=newest_event(job.pk).id,
                            data={"correct-to": "ada@example.org", "correct-subject": EMAIL["subject"],
                                  "correct-body": EMAIL["body"]})
    again = api.propose("send-1")
    assert again.status_code == 200 and again.json()["created"] is False
    decision = again.json()["decision"]
    assert decision["decision"] == "correct" and decision["by"] == "rita" and decision["note"] == "typo"


def test_the_tenants_policy_not_the_agent_decides_review(api, tenant):
    tenant_policy_set(tenant=tenant, runs_without_review=["connectors.send_email"])
    body = api.propose("send-1").json()
    assert body["needs_review"] is False and body["state"] == "READY"


def test_a_payload_its_schema_refuses_is_422_with_field_errors_and_nothing_is_created(api):
    refused = problem(api.propose("send-1", payload={"to": "nobody", "subject": "", "cc": "x"}), 422)
    locations = [tuple(e["loc"]) for e in refused["errors"]]
    assert ("body", "payload", "to") in locations and ("body", "payload", "subject") in locations
    assert ("body", "payload", "body") in locations and ("body", "payload", "cc") in locations
    assert not Job.objects.exists() and not Proposal.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"action": "connectors.send_email", "key": "bad key!", "rationale": "r"}, "key"),
    ({"action": "connectors.send_email", "key": "k-1", "rationale": ""}, "rationale"),
    ({"action": "connectors.send_email", "key": "k-1", "rationale": "null\x00here"}, "rationale"),
    ({"action": "connectors.send_email", "key": "k-1"}, "rationale"),
    ({"action": "connectors.send_email", "key": "k-1", "rationale": "r", "extra": 1}, "extra"),
    ({"action": "nothing.such", "key": "k-1", "rationale": "r"}, "action"),
])
def test_a_body_its_schema_refuses_is_422_naming_the_field(api, body, field):
    refused = problem(api.post("/proposals", body), 422)
    assert ["body", field] in [e["loc"] for e in refused["errors"]]
    assert not Job.objects.exists()


def test_a_payload_the_engine_cannot_store_is_refused_not_a_server_error(api, settings):
    # NaN is not JSON (400); a payload past JOBS_MAX_PAYLOAD_BYTES is the engine's refusal (422).
    problem(api.post("/proposals", '{"action": "connectors.send_email", "key": "k", "rationale": "r", '
                                   '"payload": {"to": "a@b.cc", "subject": "s", "body": NaN}}'), 400)
    settings.JOBS_MAX_PAYLOAD_BYTES = 1000
    refused = problem(api.propose("send-1", payload={**EMAIL, "body": "x" * 2000}), 422)
    assert "JOBS_MAX_PAYLOAD_BYTES" in refused["detail"]
    assert not Job.objects.exists() and not Proposal.objects.exists()


def test_wrong_content_type_oversized_and_malformed_bodies_have_their_statuses(api, settings):
    problem(api.post("/proposals", "action=connectors.send_email", content_type="application/x-www-form-urlencoded"),
            415)
    problem(api.post("/proposals", "{not json"), 400)
    settings.GATEWAY_MAX_BODY_BYTES = 200
    problem(api.propose("send-1", payload={**EMAIL, "body": "x" * 500}), 413)
    assert not Job.objects.exists()


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nonsense", "Basic dwk_0123456789_x",
                                    "Bearer dwk_0123456789_" + "A" * 43])
def test_no_malformed_or_unknown_key_is_401(client, db, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    for response in (client.get("/api/v1/actions", **extra), client.get("/api/v1/proposals/x", **extra),
                     client.post("/api/v1/proposals", {}, content_type="application/json", **extra)):
        problem(response, 401)
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_known_prefix_with_another_secret_is_401(api):
    prefix = api.key.split("_")[1]
    forged = f"dwk_{prefix}_" + "B" * 43
    problem(api.get("/actions", key=forged), 401)
    problem(api.propose("send-1", api_key=forged), 401)
    assert not Job.objects.exists()


def test_a_revoked_key_is_401_and_the_agents_other_keys_still_work(api):
    second = agent_key_issue(agent=api.agent, actor="t")
    agent_key_revoke(agent=api.agent, prefix=api.key.split("_")[1], actor="t")
    problem(api.get("/actions"), 401)
    assert api.get("/actions", key=second.key).status_code == 200


def test_another_tenants_key_reads_404_never_403_and_cannot_touch_the_tenants_keys(api, db):
    api.propose("send-1")
    other, issued = agent_create(tenant=tenant_ensure(slug="other"), name="assistant", actor="t")
    problem(api.get("/proposals/send-1", key=issued.key), 404)
    assert api.get("/proposals", key=issued.key).json() == {"items": [], "next": None}
    # The same business key in the other tenant is that tenant's own proposal.
    theirs = api.propose("send-1", api_key=issued.key)
    assert theirs.status_code == 201
    assert Job.objects.filter(key="send-1").count() == 2
    assert api.get("/proposals/send-1").json()["state"] == "WAITING_REVIEW"


def test_a_paused_agent_is_423_and_proposes_nothing_until_resumed(api):
    agent_pause(agent=api.agent, reason="runaway loop", actor="otto")
    refused = problem(api.propose("send-1"), 423)
    assert "runaway loop" in refused["detail"]
    assert api.get("/actions").status_code == 200  # reading is not proposing
    agent_unpause(agent=api.agent, actor="otto")
    assert api.propose("send-1").status_code == 201


def test_an_action_paused_for_the_tenant_is_423(api, tenant):
    action_pause(tenant="studio", action="connectors.send_email", reason="provider incident", actor="otto")
    problem(api.propose("send-1"), 423)
    action_resume(tenant="studio", action="connectors.send_email", actor="otto")
    assert api.propose("send-1").status_code == 201


def test_reading_a_proposal_shows_the_decision_and_the_outcome_with_receipts(api, tenant):
    from jobs.store import Store
    from tests.factories import OperationFactory, ReceiptFactory

    api.propose("send-1")
    job = Job.objects.get()
    interventions.job_approve(tenant="studio", key="send-1", reason="fine", actor="rita")
    epoch = Store().claim("studio", "send-1", "w1")
    op = OperationFactory(job=job, provider="sim-idempotent", state="ACCEPTED")
    ReceiptFactory(operation=op, provider_reference="msg-42", how="direct")
    Store().finish("studio", "send-1", "w1", epoch, result={"provider_reference": "msg-42"})
    body = api.get("/proposals/send-1").json()
    assert body["state"] == "DONE"
    assert body["decision"]["decision"] == "approve" and body["decision"]["by"] == "rita"
    assert body["outcome"] == {"state": "DONE", "result": {"provider_reference": "msg-42"},
                               "receipts": [{"provider": "sim-idempotent", "reference": "msg-42", "how": "direct"}]}


def test_the_agents_proposals_are_listed_newest_first_with_a_cursor_and_a_state_filter(api, settings, monkeypatch):
    import gateway.services as services

    monkeypatch.setattr(services, "PAGE_SIZE", 2)
    for n in range(5):
        api.propose(f"send-{n}")
    interventions.job_reject(tenant="studio", key="send-3", reason="no", actor="rita")
    first = api.get("/proposals").json()
    assert [p["key"] for p in first["items"]] == ["send-4", "send-3"] and first["next"]
    second = api.get("/proposals", cursor=first["next"]).json()
    assert [p["key"] for p in second["items"]] == ["send-2", "send-1"]
    third = api.get("/proposals", cursor=second["next"]).json()
    assert [p["key"] for p in third["items"]] == ["send-0"] and third["next"] is None
    cancelled = api.get("/proposals", state="CANCELLED").json()
    assert [p["key"] for p in cancelled["items"]] == ["send-3"] and cancelled["next"] is None
    problem(api.get("/proposals", cursor="not-a-cursor"), 422)
    problem(api.get("/proposals", state="SLEEPING"), 422)


def test_the_openapi_document_and_the_docs_are_served(client, db):
    document = client.get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert document["servers"][0]["url"] == "/api/v1"
    assert set(document["paths"]) == {"/actions", "/proposals", "/proposals/{key}"}
    posted = document["paths"]["/proposals"]["post"]["responses"]
    assert {"200", "201", "401", "403", "409", "413", "415", "422", "423", "429"} <= set(posted)
    assert "application/problem+json" in posted["409"]["content"]
    assert client.get("/api/v1/docs").status_code == 200


def test_a_key_never_appears_in_history_admin_entries_or_logs(api, caplog, client):
    caplog.set_level(logging.DEBUG)
    secret = api.key.split("_", 2)[2]
    api.propose("send-1")
    api.get("/proposals/send-1")
    api.get("/actions", key=api.key[:-1] + "x")  # a wrong key is not echoed either
    stored = json.dumps([list(JobEvent.objects.values_list("actor", "reason", "detail")),
                         list(LogEntry.objects.values_list("change_message", flat=True))], default=str)
    assert secret not in stored and secret not in caplog.text
    assert secret not in api.get("/actions", key=api.key[:-1] + "x").content.decode()


def test_over_the_per_minute_limit_is_429_with_retry_after_and_a_repeat_is_not_counted(client, tenant):
    agent, issued = agent_create(tenant=tenant, name="burst", actor="t", proposals_per_minute=2)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {issued.key}"}

    def propose(key):
        return client.post("/api/v1/proposals", {"action": "connectors.send_email", "key": key, "rationale": "r",
                                                 "payload": EMAIL}, content_type="application/json", **auth)

    assert [propose(k).status_code for k in ("a", "b")] == [201, 201]
    limited = propose("c")
    document = problem(limited, 429)
    assert 1 <= int(limited["Retry-After"]) <= 60 and document["retry_after"] == int(limited["Retry-After"])
    assert propose("a").status_code == 200  # the same proposal again is no new one
    assert not Job.objects.filter(key="c").exists()
    # The window rolls: counted from the stored proposals, a minute back.
    from datetime import timedelta

    from django.utils import timezone

    AgentProposal.objects.filter(job_key="a").update(created_at=timezone.now() - timedelta(seconds=61))
    assert propose("c").status_code == 201


def test_over_the_rolling_day_limit_is_429_until_the_oldest_leaves_the_day(client, tenant, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.GATEWAY_PROPOSALS_PER_DAY = 2  # the default, for an agent without its own
    agent, issued = agent_create(tenant=tenant, name="daily", actor="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {issued.key}"}

    def propose(key):
        return client.post("/api/v1/proposals", {"action": "connectors.send_email", "key": key, "rationale": "r",
                                                 "payload": EMAIL}, content_type="application/json", **auth)

    propose("a"), propose("b")
    AgentProposal.objects.filter(job_key="a").update(created_at=timezone.now() - timedelta(hours=23))
    limited = propose("c")
    problem(limited, 429)
    assert 3000 <= int(limited["Retry-After"]) <= 3601  # when "a" is a day old
    AgentProposal.objects.filter(job_key="a").update(created_at=timezone.now() - timedelta(hours=25))
    assert propose("c").status_code == 201


def _propose_in_child(agent_id: int, key: str) -> int:
    from gateway.models import Agent
    from gateway.problems import Refused
    from gateway.schemas import ProposalIn
    from gateway.services import proposal_propose

    agent = Agent.objects.select_related("tenant").get(pk=agent_id)
    try:
        proposal_propose(agent=agent, proposal=ProposalIn(action="connectors.send_email", key=key, rationale="r",
                                                          payload=EMAIL))
    except Refused as refused:
        return refused.status
    return 201


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_proposals_pass_the_limit_exactly_never_more():
    from tests.support import in_processes

    agent, _ = agent_create(tenant=tenant_ensure(slug="studio"), name="burst", actor="t", proposals_per_minute=3)
    results = in_processes(_propose_in_child, [(agent.pk, f"k-{n}") for n in range(8)])
    statuses = sorted(status for _, status in results)
    assert statuses == [201, 201, 201, 429, 429, 429, 429, 429]
    assert AgentProposal.objects.filter(agent=agent).count() == 3


def test_a_subject_id_written_as_a_number_with_no_fraction_is_the_integer_the_document_says(api):
    """JSON Schema counts 7.0 as an integer, as the served document's
    `subject.id` does; a fraction is refused."""
    taken = api.propose("send-1", subject={"type": "company.quote", "id": 127025398.0, "version": 2.0})
    assert taken.status_code == 201, taken.content
    job = Job.objects.get()
    assert (job.subject_id, job.subject_version) == ("127025398", 2)
    refused = problem(api.propose("send-2", subject={"type": "company.quote", "id": 7.5}), 422)
    assert any("subject" in error["loc"] for error in refused["errors"]), refused
