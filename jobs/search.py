"""The console's text search over jobs (DESIGN §16): what a job's
`search_text` holds, and the queries that read it.

`search_text` is the key, the subject, the proposer, the proposal's
rationale and the payload fields the job's action declares searchable
(`@action(searchable=…)`), case-folded, joined by newlines. It is written
when the job is created (`Store.enqueue_once`, `enqueue_many`) and when a
reviewer corrects its payload, never by a page, and kept in two places:

- on the job (`Job.search_text`) for the queues: a queue's search names its
  state, served on PostgreSQL by the partial trigram GIN index
  `job_search_queue_trgm` over the queues' items (WAITING_REVIEW,
  NEEDS_ATTENTION), so it reads its own rows' posting lists only;
- in the job's `JobSearch` row, with its key, for the job list and the key
  lookups without a tenant: the trigram GIN index `jobsearch_text_trgm`
  over every row, whatever the job's state, and the btree
  `jobsearch_key_prefix` on the key (migration 0015). That row is written
  with the job and never by a state change: the worker's claim and finish
  update jobs_job, whose indexes they must all write (no HOT update there),
  and so pay no trigram or key entry for the search.

A search is `LIKE '%term%'` on the case-folded term. A term of fewer than
three characters has no trigram and is refused by the queues rather than
scanning the table; the job list takes it as the start of a key
(`jobs_with_key_prefix`).

A job whose `JobSearch` row is missing (a row inserted by hand, not through
the Store) is still found by the queues' search, not by the job list's.
"""

import logging
from datetime import timedelta

from django.db.models import Q, QuerySet

from .actions import action_spec
from .models import Job, JobSearch

__all__ = ["search_text_for", "search_text_of_new", "search_texts_redact", "jobs_matching", "jobs_with_key_prefix", "SEARCH_MIN_CHARS", "SEARCH_MAX_CHARS"]

logger = logging.getLogger(__name__)

SEARCH_MIN_CHARS = 3  # a trigram: shorter terms cannot use the index
SEARCH_MAX_CHARS = 200
# "Waiting longer than": the age filter of the queues and the job list, by
# the job's last change (`updated_at`, the queues' order).
AGES = {"1h": timedelta(hours=1), "1d": timedelta(days=1), "3d": timedelta(days=3), "7d": timedelta(days=7)}
# The column is for finding, not for storing payloads: a long body is cut.
_TEXT_MAX = 4000


def _declared_texts(action: str, payload, job) -> list[str]:
    """The texts `action` declares searchable; `job()` gives the job, for an
    action that computes them from it."""
    spec = action_spec(action)
    if spec is None or not spec.searchable:
        return []
    if callable(spec.searchable):
        made = job()
        try:
            return [str(t) for t in (spec.searchable(made) or []) if t]
        except Exception:  # noqa: BLE001 - a search hint must never stop a job from being created
            logger.warning("action %s: its searchable texts could not be computed for %s/%s", action,
                           made.tenant, made.key, exc_info=True)
            return []
    payload = payload if isinstance(payload, dict) else {}
    return [str(payload[name]) for name in spec.searchable if payload.get(name) not in (None, "")]


def search_text_for(job, *, proposed_by: str = "", rationale: str = "") -> str:
    """The case-folded text the search reads for `job` (unsaved or saved)."""
    return _search_text(job.key, job.subject_type, job.subject_id, [proposed_by, rationale],
                        _declared_texts(job.action, job.payload, lambda: job))


def search_text_of_new(*, tenant: str, key: str, action: str, subject_type: str, subject_id: str, payload: dict,
                       proposed_by: str = "") -> str:
    """`search_text_for` the job these fields will make (a bulk enqueue),
    building it only for an action that computes its texts from a job."""
    def job():
        return Job(tenant=tenant, key=key, action=action, subject_type=subject_type, subject_id=subject_id,
                   payload=payload)

    return _search_text(key, subject_type, subject_id, [proposed_by], _declared_texts(action, payload, job))


def search_texts_redact(job_ids: list[int]) -> int:
    """Rewrite the search text of these redacted jobs (on the job and its
    `JobSearch` row) to what stays findable once the payload is gone: the
    key, the subject and the proposer — no payload field (a recipient, a
    subject line) and no rationale quoting one. Returns the rows rewritten."""
    jobs = list(Job.objects.filter(id__in=job_ids).only("id", "key", "subject_type", "subject_id", "proposed_by"))
    for job in jobs:
        job.search_text = _search_text(job.key, job.subject_type, job.subject_id, [job.proposed_by], [])
    Job.objects.bulk_update(jobs, ["search_text"], batch_size=500)
    return JobSearch.objects.bulk_update([JobSearch(job_id=job.id, search_text=job.search_text) for job in jobs],
                                         ["search_text"], batch_size=500)


def _search_text(key: str, subject_type: str, subject_id: str, given: list[str], declared: list[str]) -> str:
    parts = [key, f"{subject_type}:{subject_id}" if subject_type else subject_id, *given, *declared]
    return "\n".join(p for p in parts if p).casefold()[:_TEXT_MAX]


def jobs_matching(jobs: QuerySet, term: str, *, every_state: bool = False, masked: list[str] = ()) -> QuerySet:
    """`jobs` whose search text contains `term`, case-insensitively. For a
    queue (the caller narrows `jobs` to its state): the job's own text,
    served by `job_search_queue_trgm`. With `every_state` (the job list):
    the jobs whose `JobSearch` row matches, in any state, served by
    `jobsearch_text_trgm` and the primary key. In the `masked` tenants
    (`access.masked_tenants`: the reader sees their sensitive fields masked)
    only the start of a job's key is matched: the search text holds those
    fields in clear, and must not tell a viewer which job holds a value.
    The caller checks the term's length."""
    # One condition for both tables: a job and its search row share the
    # names `search_text`, `key` and `tenant`.
    matching = Q(search_text__contains=term.strip().casefold())
    if masked:
        matching = (matching & ~Q(tenant__in=masked)) | (Q(key__startswith=term.strip()) & Q(tenant__in=masked))
    if not every_state:
        return jobs.filter(matching)
    # A semi-join and nothing OR-ed with it: PostgreSQL then either looks the
    # matches up by primary key or, for a common term, walks the page's ids
    # and probes the search rows. An OR with the queues' own index (a job
    # without a search row) would be a filter on every row of jobs_job, or
    # an array of every match, built in full before the page is read.
    return jobs.filter(id__in=JobSearch.objects.filter(matching).values("job_id"))


def jobs_with_key_prefix(jobs: QuerySet, prefix: str) -> QuerySet:
    """`jobs` whose key starts with `prefix` (case-sensitively on
    PostgreSQL), whatever their tenant, through the `JobSearch` rows
    (`jobsearch_key_prefix`)."""
    return jobs.filter(id__in=JobSearch.objects.filter(key__startswith=prefix).values("job_id"))

