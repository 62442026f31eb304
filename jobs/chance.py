"""The engine's random numbers: poll and back-off jitter, the fair claim's
tenant sample and lottery. They come from a generator of the engine's own,
never the `random` module's shared one, so:

- an application that seeds `random` (tests, simulations) neither changes
  what the engine draws nor has its own sequence moved by a worker thread;
- a fleet started by a launcher that seeds `random` the same way in every
  process does not poll, back off and pick tenants in lock-step.

A forked child draws a new seed, as the `random` module's own generator
does (else every child of a pre-forking launcher would draw alike)."""

import os
import random

rng = random.Random()
os.register_at_fork(after_in_child=rng.seed)


def jittered(seconds: float) -> float:
    """`seconds` scaled by a random factor in [0.5, 1): a poll spread out
    over a fleet (no lock-step) that never comes round sooner than half its
    interval."""
    return seconds * (0.5 + rng.random() / 2)
