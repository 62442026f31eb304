"""Engine tables. Rules live in `states.py` and `store.py`; models only hold
fields, constraints and indexes."""

import uuid

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from .states import State


class JobQuerySet(models.QuerySet):
    """Jobs by business identity. `(tenant, key)` is unique in `JobSearch`
    (`jobsearch_unique_tenant_key`), the row written once per job, not in
    jobs_job, whose every claim and finish would write an entry of it
    (migration 0018): a key is found there and its job by primary key."""

    def by_key(self, tenant: str, key: str) -> "JobQuerySet":
        return self.filter(pk__in=JobSearch.objects.filter(tenant=tenant, key=key).values("job_id"),
                           tenant=tenant, key=key)

    def by_keys(self, tenant: str, keys) -> "JobQuerySet":
        keys = list(keys)
        return self.filter(pk__in=JobSearch.objects.filter(tenant=tenant, key__in=keys).values("job_id"),
                           tenant=tenant, key__in=keys)


class Job(models.Model):
    """A durable obligation: one business intent (`tenant`, `key`) and its
    lifecycle. The pair is unique through its `JobSearch` row, written with
    the job (`JobQuerySet`)."""

    tenant = models.CharField(max_length=64)
    key = models.CharField(max_length=200, help_text="Business identity, unique per tenant.")
    action = models.CharField(max_length=100, default="jobs.noop")
    subject_type = models.CharField(max_length=100, blank=True, default="")
    subject_id = models.CharField(max_length=100, blank=True, default="")
    subject_version = models.IntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.READY)
    priority = models.SmallIntegerField(default=0)
    # NULL means "eligible at once", whatever clock a claim passes (DESIGN §4).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    # How many times an expired lease was taken back from a silent worker.
    recoveries = models.PositiveIntegerField(default=0)
    lease_epoch = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    wait_reason = models.CharField(max_length=500, blank=True, default="")
    # The inbound provider whose event may end this wait ("" = any provider
    # bound to the job's tenant); see jobs.inbound. A database default too,
    # so bulk inserts that do not name it stay valid.
    wait_provider = models.CharField(max_length=100, blank=True, default="", db_default="")
    wake_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The last change of state; on a LEASED row, when it was claimed
    # (`claimed_at`): a renewal moves `lease_until` only.
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When retention replaced the payload (and the request bodies of its external calls)
    # of this finished job by a marker; NULL while the bodies are kept.
    redacted_at = models.DateTimeField(null=True, blank=True)
    # Who proposed the work (a person, an agent, a timer): the creation
    # event's actor, kept on the row so the queues filter by it.
    proposed_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    # What the console's text search reads (jobs.search): the key, subject,
    # proposer, rationale and the payload fields the action declares
    # searchable, case-folded. Written when the job is created or corrected,
    # with its copy in `JobSearch` (the job list's search); the queues read
    # it here.
    search_text = models.TextField(blank=True, default="", db_default="")
    # The person who took the item in a queue ("assigned to me"); nobody
    # else is kept from deciding it, but the queues show and filter by it.
    assignee = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+", db_index=False)

    objects = JobQuerySet.as_manager()

    @property
    def claimed_at(self):
        """When the current attempt was claimed (None unless LEASED). A
        claim writes no history row, and no column of its own: a LEASED
        row's `updated_at` is its claim's time (a lease renewal does not
        move it), kept with `worker_id` and `lease_epoch` until the row that
        ends the attempt (finish, wait, fail, release, recover, takeover)
        copies it into the history as that row's `claimed_at`. A column of
        its own, the table's last, made every claim log the whole row from
        `state` to the end, the search text included (migration 0020)."""
        return self.updated_at if self.state == State.LEASED else None

    class Meta:
        # No index leads with (tenant, key) here: the pair is unique in
        # `JobSearch` (see `JobQuerySet`).
        # The claim index (partial, on READY rows) is created in migration 0002
        # with vendor-specific SQL; see claim.py.
        indexes = [
            # Running jobs, per tenant: the claim's load count and the lease
            # cap read one tenant's range; the expiry sweep reads them all
            # (a fleet's running jobs, a few hundred entries).
            models.Index(
                fields=["tenant", "lease_until"], name="job_leased_expiry", condition=models.Q(state="LEASED")
            ),
            models.Index(
                fields=["wake_at"],
                name="job_waiting_wake",
                condition=models.Q(state__in=["WAITING_EXTERNAL", "WAITING_REVIEW"], wake_at__isnull=False),
            ),
            # A tenant's jobs in a waiting state (the queues, the review
            # digest, health). Only the states a worker's claim and finish
            # never write (migration 0017): a non-HOT update writes an entry
            # in every index whose condition the new row meets, so LEASED
            # rows are left to job_leased_expiry, finished ones to the
            # finished-jobs indexes, and READY rows to the claim indexes (a
            # claim's "READY jobs of tenant T" has only job_claim_tenant to
            # go to, which returns them in claim order, with or without
            # statistics).
            models.Index(fields=["state", "tenant"], name="job_state_tenant",
                         condition=~models.Q(state__in=["READY", "LEASED", "DONE", "CANCELLED"])),
            # No index on `key` alone, nor a trigram index over finished
            # rows: every claim and finish writes a new row version into
            # each index whose predicate it meets (no HOT update here), so
            # the key and text searches across states read `JobSearch`,
            # written once per job (migration 0015).

            # Retention (jobs.retention): finished jobs oldest first, in two
            # halves — those whose bodies are still to be redacted (the one
            # a finish writes) and those already redacted (written by the
            # redaction pass, off the worker's path); deletion reads both,
            # redaction the first. Live rows are in neither. Keyed by the
            # time alone: the sweep's pages read a range of it and sort each
            # instant's few ties by id (`jobs.retention.rows_after`); with
            # the id in the key every finish would write an entry 8 bytes
            # longer (migration 0022).
            models.Index(fields=["finished_at"], name="job_finished_unredacted",
                         condition=models.Q(state__in=["DONE", "CANCELLED"], redacted_at__isnull=True)),
            models.Index(fields=["finished_at"], name="job_finished_redacted",
                         condition=models.Q(state__in=["DONE", "CANCELLED"], redacted_at__isnull=False)),
            # The console's queues: one state's items oldest first (a page is
            # the index's first rows), and the age filter as a range of it.
            # The queues' text search has its trigram index (PostgreSQL,
            # `job_search_queue_trgm`) from the migration that adds `search_text`.
            models.Index(fields=["state", "updated_at", "id"], name="job_queue_order",
                         condition=models.Q(state__in=["WAITING_REVIEW", "NEEDS_ATTENTION"])),
            # "My items" and the assignee filter: only assigned rows are in it.
            models.Index(fields=["assignee", "state"], name="job_assignee",
                         condition=models.Q(assignee__isnull=False)),
            models.Index(fields=["proposed_by", "state"], name="job_proposer",
                         condition=models.Q(state__in=["WAITING_REVIEW", "NEEDS_ATTENTION"])),
        ]
        permissions = [
            ("review_job", "Can decide jobs waiting for review (approve, correct, reject)"),
            ("operate_job", "Can decide jobs that need attention (retry, resolve, cancel) and requeue events"),
        ]

    def __str__(self):
        return f"{self.tenant}/{self.key} [{self.state}]"


class JobSearch(models.Model):
    """A job's business identity and what the job list's search reads
    (jobs.search): its tenant, key and search text, one row per job, written
    with the job when it is created and when a reviewer corrects it — never
    by a state change, so the worker's claim and finish write no entry in
    these indexes. `(tenant, key)` is unique here (`jobsearch_unique_tenant_key`):
    the constraint that makes an enqueue idempotent, and the index every
    lookup by key reads (`Job.objects.by_key`). A copy of `Job.tenant`,
    `Job.key` and `Job.search_text`, which the queues keep reading on the
    job itself (`job_search_queue_trgm`).

    Searches are served by `jobsearch_key_prefix` (a key's start, or the
    whole key, in any tenant) and, on PostgreSQL, the trigram GIN index
    `jobsearch_text_trgm` over every row (migration 0015). No foreign key
    constraint: retention deletes a job's row with the job (`jobs.retention`),
    as it does its history; a job deleted through the ORM takes its row with
    it (CASCADE, done by Django), so its key is free again."""

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE, related_name="search",
                               db_constraint=False)
    tenant = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    search_text = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="jobsearch_unique_tenant_key"),
        ]
        indexes = [
            # `key LIKE 'abc%'` and `key = '…'`: this operator class lets a
            # btree serve both on PostgreSQL, whatever the collation.
            models.Index(fields=["key"], name="jobsearch_key_prefix", opclasses=["varchar_pattern_ops"]),
        ]

    def __str__(self):
        return f"search row of {self.tenant}/{self.key}"


class JobEvent(models.Model):
    """Append-only history: one row per transition, written in the same
    transaction as the state change. The evidence needed to resume.

    An attempt has one row, written when it ends: the claim (READY →
    LEASED) is kept on the job row until then, and the row that ends the
    attempt carries its `worker_id`, `epoch` and `claimed_at`. A crash
    mid-attempt leaves the job row itself as the evidence, and the recovery
    (or a takeover) writes the attempt's row."""

    # One index: `jobevent_job_id`, keyed by the job alone, serves every
    # lookup, which always names the job and sorts its few rows by id. Not
    # (job, id): a shorter entry, and a job's rows merged into one entry
    # when a page fills, so a finish's row, inserted next to its job's
    # creation row in a page the enqueue filled, splits pages less often
    # (migration 0021). On PostgreSQL the table has no primary key
    # constraint either (migration 0017): ids come from one sequence, and
    # its index would be a second entry to write per event, one no query
    # reads.
    # No database constraint and no cascade: on PostgreSQL the table is
    # partitioned by day and a deleted job's history goes with its whole
    # partition (`jobs.partitions`); retention deletes it otherwise
    # (`jobs.partitions.history_delete`).
    job = models.ForeignKey(Job, on_delete=models.DO_NOTHING, related_name="events", db_index=False,
                            db_constraint=False)
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    epoch = models.PositiveIntegerField(default=0)
    # The worker of the attempt the row ends (on other rows, the job's
    # worker at the time).
    worker_id = models.CharField(max_length=200, blank=True, default="")
    # Who acted, when it is not that worker: a person, an agent, the timer,
    # a recovery, the worker taking a job over. A worker's rows about its
    # own attempt (finish, wait, fail, release) leave it empty and name the
    # worker once, in `worker_id`, rather than the same worker id twice on
    # every attempt's row. Read `by` for who it was.
    # (jobs.store: `Store._fenced` and the batch finish, jobs.claim.)
    actor = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    # On the row that ends an attempt: when that attempt was claimed.
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job"], name="jobevent_job_id")]

    def __str__(self):
        return f"{self.kind} {self.from_state}→{self.to_state} (epoch {self.epoch})"

    @property
    def by(self) -> str:
        """Who made this change: the actor, else the attempt's own worker
        ("" for the engine's own rows that name nobody)."""
        return self.actor or self.worker_id


# ---------------------------------------------------------------- outbox (DESIGN §7)


class OutboxEvent(models.Model):
    """A fact a committed business change announces, written in the same
    transaction as the change (`jobs.outbox.outbox_emit`) and delivered by the
    relay until its consumers acknowledge it.

    `id` is what consumers deduplicate by. `sequence` numbers the events of one
    aggregate (tenant, aggregate_type, aggregate_id) in the order they were
    emitted; the relay never publishes an event while an earlier one of the
    same aggregate is still PENDING.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        PUBLISHED = "PUBLISHED", "Published"
        QUARANTINED = "QUARANTINED", "Quarantined"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.CharField(max_length=64)
    aggregate_type = models.CharField(max_length=100)
    aggregate_id = models.CharField(max_length=100)
    sequence = models.PositiveBigIntegerField(help_text="Position among this aggregate's events, from 1.")
    event_type = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    state = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    # Counted when the relay claims the event, before it publishes: a consumer
    # that crashes the relay process still uses up an attempt. Doubles as the
    # fence of the relay's writes (a relay whose claim expired writes nothing).
    attempts = models.PositiveIntegerField(default=0)
    # NULL means "eligible at once"; while claimed, the end of the claim.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # Serves outbox_emit's "next sequence of this aggregate" and makes
            # two concurrent emitters of one aggregate take turns.
            models.UniqueConstraint(
                fields=["tenant", "aggregate_type", "aggregate_id", "sequence"], name="outbox_aggregate_sequence"
            ),
        ]
        indexes = [
            # The relay's scan: PENDING events oldest first.
            models.Index(fields=["created_at", "sequence"], name="outbox_pending_order",
                         condition=models.Q(state="PENDING")),
            # The relay's per-aggregate order probe: "is an earlier event of
            # this aggregate still PENDING?" never visits published history.
            models.Index(fields=["tenant", "aggregate_type", "aggregate_id", "sequence"],
                         name="outbox_pending_aggregate", condition=models.Q(state="PENDING")),
            # Health and the operators' list: quarantined events.
            models.Index(fields=["created_at"], name="outbox_quarantined", condition=models.Q(state="QUARANTINED")),
        ]

    def __str__(self):
        return f"{self.event_type} {self.aggregate_type}/{self.aggregate_id}#{self.sequence} [{self.state}]"


# ---------------------------------------------------------------- inbound events (DESIGN §7)


class InboundEvent(models.Model):
    """Something that arrived from outside (a customer reply, a delivery
    report), authenticated and recorded once per provider event id before
    anything is applied (`jobs.inbound.inbound_event_receive`)."""

    class Status(models.TextChoices):
        APPLIED = "APPLIED", "Applied"  # resumed the waiting job it correlates to
        UNMATCHED = "UNMATCHED", "Unmatched"  # kept for an operator: no waiting job took it
        RESOLVED = "RESOLVED", "Resolved"  # an operator dealt with an unmatched event

    provider = models.CharField(max_length=50)
    event_id = models.CharField(max_length=200, help_text="The provider's event id: the dedupe key.")
    event_type = models.CharField(max_length=100)
    tenant = models.CharField(max_length=64, blank=True, default="")
    correlation = models.JSONField(default=dict, blank=True)
    body = models.JSONField(default=dict, blank=True, help_text="The event as received.")
    state = models.CharField(max_length=20, choices=Status.choices)
    job = models.ForeignKey("Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="inbound_events")
    note = models.TextField(blank=True, default="", help_text="Why it was not applied, or how it was resolved.")
    received_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            # A redelivery of the same provider event is recognised, never applied twice.
            models.UniqueConstraint(fields=["provider", "event_id"], name="inbound_provider_event"),
        ]
        indexes = [
            # The operators' queue and the health count: unmatched events.
            models.Index(fields=["received_at"], name="inbound_unmatched", condition=models.Q(state="UNMATCHED")),
        ]

    def __str__(self):
        return f"{self.provider}:{self.event_id} {self.event_type} [{self.state}]"


# ---------------------------------------------------------------- timers (DESIGN §8)


class Timer(models.Model):
    """Permission to reconsider at `scheduled_for`, not an instruction frozen
    in the past: when due, the subject is re-read (`jobs.timers`) and the
    timer fires, is cancelled, or is superseded by a re-planned one.

    It wakes a waiting `job` (bound to the wait begun at `job_epoch`, when
    set) or, without a job, enqueues `action` under `job_key`.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        FIRED = "FIRED", "Fired"
        CANCELLED = "CANCELLED", "Cancelled"
        SUPERSEDED = "SUPERSEDED", "Superseded"

    tenant = models.CharField(max_length=64)
    job = models.ForeignKey("Job", null=True, blank=True, on_delete=models.CASCADE, related_name="timers")
    # The job's lease epoch when the timer was set from its handler: the timer
    # belongs to that wait and is cancelled once the job has moved on.
    job_epoch = models.PositiveIntegerField(null=True, blank=True)
    action = models.CharField(max_length=100, blank=True, default="", help_text="Enqueued on firing when no job is set.")
    job_key = models.CharField(max_length=200, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    subject_type = models.CharField(max_length=100, blank=True, default="")
    subject_id = models.CharField(max_length=100, blank=True, default="")
    subject_version = models.IntegerField(null=True, blank=True)
    scheduled_for = models.DateTimeField()
    reason = models.CharField(max_length=500)
    cancellation_condition = models.CharField(max_length=100, blank=True, default="",
                                              help_text="A registered predicate name; empty: none.")
    cancellation_args = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    state = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    fired_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    outcome = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    superseded_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The firing scan: due PENDING timers, earliest first. Fired and
            # cancelled history is never visited, however much piles up.
            models.Index(fields=["scheduled_for", "id"], name="timer_pending_due",
                         condition=models.Q(state="PENDING")),
            # A subject's pending timers (`timers_pending_for_subject`: a
            # review's, cancelled by every decision; an invoice's reminder).
            models.Index(fields=["subject_type", "subject_id"], name="timer_pending_subject",
                         condition=models.Q(state="PENDING")),
        ]

    def __str__(self):
        return f"{self.reason} at {self.scheduled_for:%Y-%m-%d %H:%M} [{self.state}]"


# ---------------------------------------------------------------- review deadlines


class ReviewDeadline(models.Model):
    """The clock of a job's current stay in WAITING_REVIEW (kept by the review
    layer through `transitions.on_review_change`): which `round` it is (a new stay, or a correction the policy lets restart
    the clock, begins a new one; the round's timers die with it), when it is
    due, and since when it is overdue. When the job leaves review its times
    are cleared and the row stays: rounds count over the job's whole life,
    so no two stays share a round (nor the escalation keys named by it)."""

    job = models.OneToOneField("Job", primary_key=True, on_delete=models.CASCADE, related_name="review_deadline")
    tenant = models.CharField(max_length=64)
    round = models.PositiveIntegerField(default=1)
    entered_at = models.DateTimeField()
    due_at = models.DateTimeField(null=True, blank=True)
    overdue_at = models.DateTimeField(null=True, blank=True)
    reject_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # "Overdue" in a tenant's review queue: only the overdue rows are indexed.
            models.Index(fields=["tenant", "overdue_at"], name="review_overdue",
                         condition=models.Q(overdue_at__isnull=False)),
        ]

    def __str__(self):
        return f"review of job {self.job_id}, round {self.round}, due {self.due_at}"


# ---------------------------------------------------------------- claim bookkeeping (DESIGN §5)


class ReadyTenant(models.Model):
    """A tenant that has (or recently had) READY jobs: the small table the fair
    claim samples tenants from, so choosing a tenant costs O(log tenants), not
    a walk over all of them (jobs/claim.py).

    PostgreSQL only, and maintained by the database itself: triggers on
    jobs_job add a tenant whenever one of its jobs is inserted READY or moves
    to READY (whatever code path does it); the claim removes a tenant it finds
    without READY jobs (migration 0007 explains why that removal cannot lose
    a tenant that just got work). On SQLite the table stays empty: claims
    there are serialised and choose the tenant with an exact query."""

    tenant = models.CharField(max_length=64, primary_key=True)
    # A random position: a claim samples the tenants that follow a random
    # point, so every tenant is equally likely to be looked at.
    slot = models.FloatField(db_default=models.Func(function="RANDOM"))
    # When the tenant (re)gained READY work: the newest are always looked at,
    # so a tenant that was idle starts within a claim or two.
    added = models.DateTimeField(db_default=models.functions.Now())

    class Meta:
        indexes = [
            models.Index(fields=["slot"], name="readytenant_slot"),
            models.Index(fields=["added"], name="readytenant_added"),
        ]

    def __str__(self):
        return self.tenant


class DecisionBatch(models.Model):
    """One bulk decision over a queue's query (the review layer takes it):
    the exact items its preview showed, each with the history row it was
    seen at, and what became of each when it was taken. Each decided job's
    event names it."""

    class Status(models.TextChoices):
        PREVIEWED = "PREVIEWED", "Previewed"
        # Being taken (or cut off while it was: a request that died leaves
        # it here, and its user may take it again once it stalled).
        TAKING = "TAKING", "Being taken"
        # Taken, but an item hit an error (a deadlock, a lost connection):
        # its user may take it again for the items left.
        INTERRUPTED = "INTERRUPTED", "Interrupted"
        DONE = "DONE", "Done"

    # The secret the preview page hands its form: only its user may take
    # the batch, once.
    token = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    queue = models.CharField(max_length=20)  # the job state of the queue it was taken from
    query = models.JSONField(default=dict, blank=True, help_text="The queue's filters the set was chosen by.")
    # [[job id, seen event id], ...] oldest first, as the preview showed them.
    items = models.JSONField(default=list, blank=True)
    tenants = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PREVIEWED)
    decision = models.CharField(max_length=20, blank=True, default="")
    note = models.TextField(blank=True, default="")
    # {job id: "decided" | "first approval recorded" | "moved: …" |
    # "refused: …" | "interrupted: …"}, item by item as it is taken; an
    # item without one was not taken yet.
    outcome = models.JSONField(default=dict, blank=True)
    decided = models.PositiveIntegerField(default=0)
    # Approvals recorded as the first of two (the item stays in review).
    first_approvals = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    taken_at = models.DateTimeField(null=True, blank=True)
    # When the take last finished an item: a batch TAKING that has not moved
    # for a while was cut off.
    progress_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "decision batches"

    def __str__(self):
        what = self.decision or "preview"
        return f"batch {self.pk}: {what} of {len(self.items)} item(s) [{self.status}]"

    @property
    def unfinished(self) -> int:
        """Items not (yet) decided, skipped or refused: not reached, or interrupted."""
        return len(self.items) - self.decided - self.first_approvals - self.skipped - self.refused
