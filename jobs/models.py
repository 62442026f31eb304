"""Engine tables. Rules live in `states.py` and `store.py`; models only hold
fields, constraints and indexes."""

from django.db import models

from .states import State


class Job(models.Model):
    """A durable obligation: one business intent (`tenant`, `key`) and its lifecycle."""

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
    wake_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="job_unique_tenant_key"),
        ]
        # The claim index (partial, on READY rows) is created in migration 0002
        # with vendor-specific SQL; see claim.py.
        indexes = [
            models.Index(
                fields=["lease_until"], name="job_leased_expiry", condition=models.Q(state="LEASED")
            ),
            models.Index(
                fields=["wake_at"],
                name="job_waiting_wake",
                condition=models.Q(state__in=["WAITING_EXTERNAL", "WAITING_REVIEW"], wake_at__isnull=False),
            ),
            models.Index(fields=["state", "tenant"], name="job_state_tenant"),
        ]

    def __str__(self):
        return f"{self.tenant}/{self.key} [{self.state}]"


class JobEvent(models.Model):
    """Append-only history: one row per transition, written in the same
    transaction as the state change. The evidence needed to resume."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    epoch = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"], name="jobevent_job_id")]

    def __str__(self):
        return f"{self.kind} {self.from_state}→{self.to_state} (epoch {self.epoch})"
