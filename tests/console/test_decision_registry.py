"""Where decisions come from: the engine's job decisions are transitions of
the state machine narrowed to a person's queue; an app above registers its
own (with its own permission); a human decision is the outermost transaction."""

import pytest
from django.db import transaction

from jobs import access
from jobs.states import TRANSITIONS, State
from review import decisions

from .conftest import make_job, newest_event

JOB_DECISIONS = ("approve", "reject", "correct", "retry", "resolve", "cancel")


def test_each_job_decision_applies_only_to_states_its_transition_leaves_from():
    for name in JOB_DECISIONS:
        decision = access.DECISIONS[name]
        assert decision.states and decision.states <= TRANSITIONS[name].sources, name
    assert access.DECISIONS["retry"].states == {State.NEEDS_ATTENTION}  # narrowed to the attention queue


def test_a_decision_on_a_queue_its_transition_does_not_leave_is_refused_at_definition():
    with pytest.raises(ValueError, match="does not leave"):
        access.job_decision("approve_done", "Approve", "jobs.review_job", access.REVIEWER, transition="approve",
                            queue=State.DONE)


def test_the_operations_app_registers_its_decisions_with_its_own_permission():
    assert access.DECISIONS["decide_operation"].permission == "operations.decide_operation"
    assert access.DECISIONS["clear_pause"].states == frozenset()


def test_registering_another_decision_under_a_known_name_is_an_error_and_the_same_one_is_harmless():
    known = access.DECISIONS["approve"]
    access.register_decision(known)
    with pytest.raises(ValueError, match="already registered"):
        access.register_decision(access.Decision("approve", "Approve", "jobs.operate_job", frozenset(), frozenset()))
    assert access.DECISIONS["approve"] is known


@pytest.mark.django_db(transaction=True)
def test_a_decision_nested_in_another_transaction_is_a_loud_error_and_changes_nothing(people):
    job = make_job("q-1", "WAITING_REVIEW")
    with pytest.raises(RuntimeError, match="durable"):
        with transaction.atomic():
            decisions.job_approve(job_id=job.pk, user=people["reviewer"], note="ok", seen_event=newest_event(job))
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    decisions.job_approve(job_id=job.pk, user=people["reviewer"], note="ok", seen_event=newest_event(job))
    job.refresh_from_db()
    assert job.state == "READY"
