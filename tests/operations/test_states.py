"""The operation transition table refuses changes it does not list."""

import pytest

from operations.errors import OperationStateError
from operations.models import Operation, OperationEvent
from operations.states import operation_transition
from tests.factories import OperationFactory


@pytest.fixture
def accepted(store):
    job = store.enqueue("studio", "send-1", action="connectors.send_email")
    return OperationFactory(job=job, request={}, state="ACCEPTED")


@pytest.mark.django_db
def test_an_accepted_operation_can_never_be_sent_again_and_nothing_is_written(accepted):
    with pytest.raises(OperationStateError):
        operation_transition(accepted, "dispatch", to_state="INTENDED", actor="w1", attempts=9)
    accepted.refresh_from_db()
    assert (accepted.state, accepted.attempts) == ("ACCEPTED", 0)
    assert not OperationEvent.objects.exists()


@pytest.mark.django_db
def test_evidence_without_a_state_change_is_always_recorded(accepted):
    operation_transition(accepted, "note", actor="ops", reason="provider support confirmed delivery")
    assert list(OperationEvent.objects.values_list("kind", "from_state", "to_state")) == [
        ("note", "ACCEPTED", "ACCEPTED")
    ]


@pytest.fixture
def investigating(accepted):
    Operation.objects.filter(pk=accepted.pk).update(state="NEEDS_INVESTIGATION", attempts=1)
    accepted.refresh_from_db()
    return accepted


@pytest.mark.django_db
@pytest.mark.parametrize("to_state", ["INTENDED", "UNKNOWN", "REJECTED"])
def test_an_operation_under_investigation_is_never_sent_again_by_a_machine(investigating, to_state):
    with pytest.raises(OperationStateError):
        operation_transition(investigating, "dispatch", to_state=to_state, actor="w1", attempts=2)
    investigating.refresh_from_db()
    assert (investigating.state, investigating.attempts) == ("NEEDS_INVESTIGATION", 1)
    assert not OperationEvent.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("to_state", ["ACCEPTED", "FAILED"])
def test_a_human_decides_an_operation_under_investigation(investigating, to_state):
    operation_transition(investigating, "human_decision", to_state=to_state, actor="ops", reason="checked")
    investigating.refresh_from_db()
    assert investigating.state == to_state
    assert list(OperationEvent.objects.values_list("from_state", "to_state", "actor")) == [
        ("NEEDS_INVESTIGATION", to_state, "ops")
    ]
