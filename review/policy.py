"""The terms a review is held to: due times, four eyes.

The review layer knows nothing of tenants' policies: the business app registers
one function (`register_review_policy`) that answers, for a job waiting for
review, how many distinct people must approve it, when it is due, when an
overdue item is rejected and whether a correction restarts its clock. Without
one, every review needs one approval and has no due time.
"""

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ReviewTerms", "register_review_policy", "review_terms", "POLICY_ACTOR"]

# The actor of what the policy itself does (marking overdue, rejecting).
POLICY_ACTOR = "review policy"


@dataclass(frozen=True)
class ReviewTerms:
    """`approvals`: distinct people who must approve (1 or 2); `due_after`:
    seconds from entering review to overdue (None: never due);
    `reject_after`: seconds from overdue to a rejection by the policy (None:
    it stays overdue); `reset_on_correction`: a correction (the first of
    two approvals, edited) starts the clock again."""

    approvals: int = 1
    due_after: float | None = None
    reject_after: float | None = None
    reset_on_correction: bool = False
    source: str = "default"  # which policy said so, for the page and the history


DEFAULT_TERMS = ReviewTerms()

_policy: list[Callable] = []


def register_review_policy(policy: Callable) -> None:
    """Install `policy(job) -> ReviewTerms` (the one policy; registering
    again replaces it)."""
    _policy[:] = [policy]


def review_terms(job) -> ReviewTerms:
    """The terms `job`'s review is held to now."""
    if not _policy:
        return DEFAULT_TERMS
    return _policy[0](job) or DEFAULT_TERMS
