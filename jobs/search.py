"""The console's text search over jobs (DESIGN §16): what a job's
`search_text` holds, and the one query that reads it.

`search_text` is the key, the subject, the proposer, the proposal's
rationale and the payload fields the job's action declares searchable
(`@action(searchable=…)`), case-folded, joined by newlines. It is written
when the job is created (`Store.enqueue_once`, `enqueue_many`) and when a
reviewer corrects its payload, never by a page. A search is
`search_text LIKE '%term%'` on the case-folded term, served on PostgreSQL
by two partial trigram GIN indexes (migration 0009): `job_search_queue_trgm`
over the queues' items (WAITING_REVIEW, NEEDS_ATTENTION) — a queue's search
names its state, so it reads its own rows' posting lists only — and
`job_search_rest_trgm` over the other rows at rest (finished, waiting
outside). READY and LEASED rows are in neither (every claim and renewal
would otherwise write the row's trigrams again): the job list finds them by
the start of their key (`job_key_prefix`), the index scans OR-ed
(`jobs_matching(…, every_state=True)`). A term of fewer than three
characters has no trigram and is refused by the console rather than
scanning the table.
"""

import logging
from datetime import timedelta

from django.db.models import Q, QuerySet

from .actions import action_spec
from .states import State

__all__ = ["search_text_for", "jobs_matching", "SEARCH_MIN_CHARS", "SEARCH_MAX_CHARS"]

logger = logging.getLogger(__name__)

SEARCH_MIN_CHARS = 3  # a trigram: shorter terms cannot use the index
SEARCH_MAX_CHARS = 200
# "Waiting longer than": the age filter of the queues and the job list, by
# the job's last change (`updated_at`, the queues' order).
AGES = {"1h": timedelta(hours=1), "1d": timedelta(days=1), "3d": timedelta(days=3), "7d": timedelta(days=7)}
# The column is for finding, not for storing payloads: a long body is cut.
_TEXT_MAX = 4000


def _declared_texts(job) -> list[str]:
    spec = action_spec(job.action)
    if spec is None or not spec.searchable:
        return []
    if callable(spec.searchable):
        try:
            return [str(t) for t in (spec.searchable(job) or []) if t]
        except Exception:  # noqa: BLE001 - a search hint must never stop a job from being created
            logger.warning("action %s: its searchable texts could not be computed for %s/%s", job.action,
                           job.tenant, job.key, exc_info=True)
            return []
    payload = job.payload if isinstance(job.payload, dict) else {}
    return [str(payload[name]) for name in spec.searchable if payload.get(name) not in (None, "")]


def search_text_for(job, *, proposed_by: str = "", rationale: str = "") -> str:
    """The case-folded text the search reads for `job` (unsaved or saved)."""
    parts = [job.key, f"{job.subject_type}:{job.subject_id}" if job.subject_type else job.subject_id,
             proposed_by, rationale, *_declared_texts(job)]
    return "\n".join(p for p in parts if p).casefold()[:_TEXT_MAX]


QUEUE_STATES = (State.WAITING_REVIEW, State.NEEDS_ATTENTION)
# The states whose rows neither trigram index holds (the engine's hot path).
UNINDEXED_STATES = (State.READY, State.LEASED)


def jobs_matching(jobs: QuerySet, term: str, *, every_state: bool = False) -> QuerySet:
    """`jobs` whose search text contains `term`, case-insensitively. For a
    queue (the caller narrows `jobs` to its state): served by
    `job_search_queue_trgm`. With `every_state` (the job list): each index's
    rows by their own arm, and READY and LEASED jobs by a key starting with
    `term` (`job_key_prefix`). The caller checks the term's length."""
    contains = Q(search_text__contains=term.strip().casefold())
    if not every_state:
        return jobs.filter(contains)
    return jobs.filter((contains & Q(state__in=QUEUE_STATES))
                       | (contains & ~Q(state__in=(*UNINDEXED_STATES, *QUEUE_STATES)))
                       | Q(key__startswith=term.strip()))
