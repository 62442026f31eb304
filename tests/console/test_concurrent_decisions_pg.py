"""Two reviewers deciding the same item at the same moment, on real parallel
PostgreSQL connections: exactly one decision is applied, the other is told
who decided, and nothing else changes."""

import threading

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection

from review.decisions import AlreadyDecided, job_approve, job_reject
from tests.factories import MembershipFactory, UserFactory

from .conftest import make_job, newest_event

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_concurrent_decisions_one_wins_the_other_is_told(people):
    job = make_job("q-1", "WAITING_REVIEW")
    second = UserFactory(username="ruth", staff=True, groups=people["reviewer"].groups.all())
    MembershipFactory(user=second, tenant=people["reviewer"].memberships.get().tenant, role="reviewer")
    seen = newest_event(job)
    start = threading.Barrier(2)
    outcomes = {}

    def decide(name, service, user):
        try:
            start.wait(timeout=30)
            service(job_id=job.pk, user=user, note=f"{name} decided", seen_event=seen)
            outcomes[name] = "applied"
        except AlreadyDecided as exc:
            outcomes[name] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=("approve", job_approve, people["reviewer"])),
               threading.Thread(target=decide, args=("reject", job_reject, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(outcomes) == ["approve", "reject"]
    applied = [name for name, outcome in outcomes.items() if outcome == "applied"]
    assert len(applied) == 1
    [loser] = [outcome for outcome in outcomes.values() if outcome != "applied"]
    winner_user = "rita" if applied == ["approve"] else "ruth"
    assert loser.startswith(f"already decided by {winner_user} at")
    job.refresh_from_db()
    assert job.state == ("READY" if applied == ["approve"] else "CANCELLED")
    assert job.events.filter(kind__in=["approve", "reject"]).count() == 1
    assert LogEntry.objects.filter(object_id=str(job.pk)).count() == 1
