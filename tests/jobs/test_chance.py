"""The engine draws its jitter, tenant sample and lottery from a generator
of its own (`jobs.chance`): an application seeding `random` neither moves
nor is moved by it, and forked workers do not draw alike."""

import random

from jobs import chance
from jobs.retry import RetryPolicy
from tests.support import in_processes


def test_the_engine_s_draws_leave_the_application_s_seeded_random_alone():
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    RetryPolicy().backoff(3)  # a worker's back-off, drawn meanwhile
    chance.rng.random()
    assert [random.random() for _ in range(3)] == expected


def test_seeding_the_application_s_random_does_not_fix_the_engine_s_draws():
    random.seed(99)
    first = [chance.rng.random() for _ in range(3)]
    random.seed(99)
    assert [chance.rng.random() for _ in range(3)] != first


def _draw(n):
    return [chance.rng.random() for _ in range(3)]


def test_forked_children_draw_different_numbers():
    results = in_processes(_draw, [(n,) for n in range(3)])
    draws = [tuple(r) for status, r in results if status == "ok"]
    assert len(draws) == 3 and len(set(draws)) == 3
