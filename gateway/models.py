"""The agent gateway's tables (DESIGN §15): outside agents, their API keys,
what each proposed and the outcome events delivered to it. Rules live in
`gateway/services.py` and `gateway/callbacks.py`."""

import uuid

from django.db import models


class Agent(models.Model):
    """An outside agent acting for one tenant: it may propose `actions`
    (None: every registered action that declares a payload schema), within
    its limits (None: the defaults in settings), and learns outcomes at its
    `callback_url`, signed with `callback_secret`. A paused agent proposes
    nothing and its jobs not yet dispatched are held."""

    tenant = models.ForeignKey("company.Tenant", on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=100)
    actions = models.JSONField(null=True, blank=True, help_text="Actions it may propose; empty: every one with a schema.")
    proposals_per_minute = models.PositiveIntegerField(null=True, blank=True)
    proposals_per_day = models.PositiveIntegerField(null=True, blank=True)
    callback_url = models.CharField(max_length=500, blank=True, default="")
    callback_secret = models.CharField(max_length=100, blank=True, default="")
    paused = models.BooleanField(default=False)
    paused_reason = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_unique_tenant_name")]
        permissions = [("manage_agent", "Can create agents, issue and revoke their keys, pause and resume them")]

    def __str__(self):
        return f"{self.name} ({self.tenant.slug})"


class ApiKey(models.Model):
    """One key of an agent: `dwk_<prefix>_<secret>`. Only the prefix (to find
    it, and to name it to people) and the SHA-256 of the secret are kept; the
    key itself is shown once, when it is issued."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, default="")
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"dwk_{self.prefix}_… ({'revoked' if self.revoked_at else 'active'})"


class AgentProposal(models.Model):
    """Which agent proposed which of the tenant's proposals (`company.Proposal`),
    and how far the delivery of its outcome events has read the job's
    history (`events_seen`: the last history row looked at)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="proposals")
    proposal = models.OneToOneField("company.Proposal", on_delete=models.CASCADE, related_name="agent_proposal")
    tenant = models.CharField(max_length=64)
    job_key = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # While True the callback sweep looks at the job (its agent has a callback
    # URL and the job has not finished, or its last events are not delivered).
    watching = models.BooleanField(default=False)
    events_seen = models.BigIntegerField(default=0)
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The dispatch guard finds a job's agent by this (tenant, key).
            models.UniqueConstraint(fields=["tenant", "job_key"], name="agentproposal_unique_tenant_key"),
        ]
        indexes = [
            # The agent's proposals, newest first (the API's list and its cursor).
            models.Index(fields=["agent", "id"], name="agentproposal_agent_id"),
            # The proposal limits: the agent's proposals since a moment.
            models.Index(fields=["agent", "created_at"], name="agentproposal_agent_created"),
            # The callback sweep: watched proposals, least recently checked first.
            models.Index(fields=["checked_at", "id"], name="agentproposal_watching",
                         condition=models.Q(watching=True)),
        ]

    def __str__(self):
        return f"{self.agent.name}: {self.job_key}"


class CallbackEvent(models.Model):
    """One outcome event for an agent (`id` is the event id the receiver
    deduplicates by), delivered by its own job (`job_key`) with an operation
    and a receipt. Its id is derived from the history row it reports, so
    reading that row again yields the same event, never a second one."""

    class Type(models.TextChoices):
        DECIDED = "proposal.decided"
        DONE = "proposal.done"
        NEEDS_ATTENTION = "proposal.needs_attention"
        CANCELLED = "proposal.cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="callback_events")
    proposal = models.ForeignKey(AgentProposal, on_delete=models.CASCADE, related_name="callback_events")
    type = models.CharField(max_length=40, choices=Type.choices)
    job_key = models.CharField(max_length=200, help_text="The job that delivers it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["proposal", "created_at"], name="callbackevent_proposal")]

    def __str__(self):
        return f"{self.type} {self.id}"
