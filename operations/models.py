"""Operations: the fence around the outside world (DESIGN §6).

A job's lease fences writes to the job table; it cannot recall an email a
provider already accepted. An `Operation` is the durable intent of one
external call, written before any byte leaves; a `Receipt` is the evidence
that the provider holds it. The rules that move them live in
`operations/protocol.py` and `operations/services.py`; these models only hold
fields, constraints and indexes.
"""

import uuid

from django.db import models


class OperationState(models.TextChoices):
    # Persisted before dispatch; the request may or may not have left since.
    INTENDED = "INTENDED", "Intended"
    # The provider holds it; a receipt exists.
    ACCEPTED = "ACCEPTED", "Accepted"
    # The request may have reached the provider and no answer says what
    # became of it (timeout, reset, 5xx): to be reconciled, never "failed".
    UNKNOWN = "UNKNOWN", "Unknown (to reconcile)"
    # The provider refused the request permanently (validation).
    REJECTED = "REJECTED", "Rejected"
    # The provider confirmed it did not accept (unreachable, 429, 401/403),
    # or a human confirmed it: sending again is safe.
    FAILED = "FAILED", "Failed (not accepted)"
    # Cannot be reconciled by machine: a human must find out.
    NEEDS_INVESTIGATION = "NEEDS_INVESTIGATION", "Needs investigation"


# States in which the provider may hold the message without us knowing.
IN_DOUBT = frozenset({OperationState.INTENDED, OperationState.UNKNOWN, OperationState.NEEDS_INVESTIGATION})


class Operation(models.Model):
    """The intent of one external call by one job step.

    `intent_key` is the idempotency key and the client reference sent to the
    provider, so every attempt of the step speaks of the same message. It is
    derived from the obligation (`operations.digest.intent_key`), not from
    `id`: an intent recorded again after a lost commit is the same intent to
    the provider.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    intent_key = models.CharField(max_length=64, help_text="Idempotency key and client reference sent to the "
                                                           "provider, derived from the obligation.")
    tenant = models.CharField(max_length=64)
    # PROTECT: an operation is evidence of what was done in the job's name.
    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="operations")
    step = models.CharField(max_length=100, help_text="The job step this call belongs to; a retry reuses it.")
    provider = models.CharField(max_length=100)
    kind = models.CharField(max_length=50, help_text="What the call does, e.g. email.send.")
    # The job's action when the intent was recorded: effect limits count per
    # (tenant, action) over a rolling window (operation_effect_limit index).
    action = models.CharField(max_length=100, blank=True, default="", db_default="")
    request_digest = models.CharField(max_length=64, help_text="SHA-256 of the canonical JSON request.")
    request = models.JSONField(help_text="The request as sent, without secrets.")
    state = models.CharField(max_length=24, choices=OperationState.choices, default=OperationState.INTENDED)
    attempts = models.PositiveIntegerField(default=0, help_text="Requests sent to the provider (not lookups).")
    # When the latest request may have started to leave: a lookup that finds
    # nothing is only trusted once a request started then has had time to land.
    last_dispatched_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="operation_one_per_job_step"),
        ]
        indexes = [
            # Serves the operator's lists (operations to investigate or reconcile).
            models.Index(fields=["state", "tenant"], name="operation_state_tenant"),
            # An effect limit's count: this tenant's intents of one action
            # since the window began, newest first (operations.limits).
            models.Index(fields=["tenant", "action", "created_at"], name="operation_effect_limit"),
        ]
        permissions = [
            ("decide_operation", "Can decide operations in doubt and clear connector pauses"),
        ]

    def __str__(self):
        return f"{self.kind} {self.id} [{self.state}]"


class ReceiptHow(models.TextChoices):
    DIRECT = "direct", "Direct answer"
    IDEMPOTENT_REPLAY = "idempotent_replay", "Idempotent replay"
    LOOKUP = "lookup", "Lookup"
    HUMAN = "human", "Human, with evidence"


class Receipt(models.Model):
    """The provider holds the operation's message: its reference, when it
    accepted it, the evidence and how we came to know."""

    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="receipt")
    provider_reference = models.CharField(max_length=200)
    accepted_at = models.DateTimeField()
    how = models.CharField(max_length=20, choices=ReceiptHow.choices)
    # Response status, the headers that matter (request id, replayed), the
    # provider's answer; for a human receipt, what they looked at.
    evidence = models.JSONField(default=dict, blank=True)
    recorded_by = models.CharField(max_length=200, help_text="The worker, or the person, who recorded it.")
    reason = models.TextField(blank=True, default="", help_text="Why a human vouches for it.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.provider_reference} ({self.how})"


class OperationEvent(models.Model):
    """Append-only history of an operation: each dispatch, answer, lookup and
    human decision, written in the same transaction as the change."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=24, blank=True, default="")
    to_state = models.CharField(max_length=24, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    epoch = models.PositiveIntegerField(null=True, blank=True, help_text="The job's lease epoch, for a worker.")
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["operation", "id"], name="operationevent_op_id")]

    def __str__(self):
        return f"{self.kind} {self.from_state}→{self.to_state}"


class ConnectorPause(models.Model):
    """A provider refused a tenant's credentials: nothing more is sent for
    that (tenant, provider) until an operator clears the pause. Cleared rows
    are kept as history."""

    tenant = models.CharField(max_length=64)
    provider = models.CharField(max_length=100)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    reason = models.TextField()
    # The operation whose dispatch was refused (evidence for the operator).
    operation = models.ForeignKey(Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    paused_at = models.DateTimeField(auto_now_add=True)
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by = models.CharField(max_length=200, blank=True, default="")
    clear_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # At most one pause in force per (tenant, provider); it also
            # serves the check made before every dispatch.
            models.UniqueConstraint(
                fields=["tenant", "provider"],
                condition=models.Q(cleared_at__isnull=True),
                name="connector_pause_one_active",
            ),
        ]

    @property
    def active(self) -> bool:
        return self.cleared_at is None

    def __str__(self):
        status = "active" if self.active else "cleared"
        return f"{self.provider} for {self.tenant} ({status})"


class ActionLimit(models.Model):
    """What one tenant lets one action do to the outside world: at most
    `max_effects` new operations per rolling `window_seconds` (none: no
    limit), or nothing at all while `paused`. Checked where every operation
    is dispatched (`operations.protocol`), so no path goes around it; a job
    over the limit or held by the pause waits, visibly, and is never
    dropped. The row is also the lock that makes concurrent workers count
    one at a time."""

    tenant = models.CharField(max_length=64)
    action = models.CharField(max_length=100)
    max_effects = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="New operations per window; empty: no limit.")
    window_seconds = models.PositiveIntegerField(default=24 * 3600)
    paused = models.BooleanField(default=False)
    paused_reason = models.TextField(blank=True, default="")
    updated_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "action"], name="action_limit_unique")]
        permissions = [("manage_action_limit", "Can set an action's effect limit and pause or resume it")]

    def __str__(self):
        limit = f"{self.max_effects} per {self.window_seconds}s" if self.max_effects is not None else "no limit"
        return f"{self.action} for {self.tenant}: {limit}{' (paused)' if self.paused else ''}"


class DispatchHold(models.Model):
    """A job whose dispatch a pause holds back (`cause`: "action:<name>", or
    the cause a registered dispatch guard names, e.g. an agent's): lifting
    that pause resumes it at once (`operations.limits.dispatch_holds_release`);
    until then the job waits, re-checking now and then."""

    tenant = models.CharField(max_length=64)
    job_key = models.CharField(max_length=200)
    cause = models.CharField(max_length=200)
    reason = models.TextField()
    held_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "job_key"], name="dispatch_hold_one_per_job")]
        indexes = [models.Index(fields=["tenant", "cause"], name="dispatch_hold_cause")]

    def __str__(self):
        return f"{self.tenant}/{self.job_key} held by {self.cause}"
