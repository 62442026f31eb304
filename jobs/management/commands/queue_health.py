import json

from django.core.management.base import BaseCommand

from durable.numbers import number_flag
from jobs.health import queue_health


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


class Command(BaseCommand):
    help = (
        "Show queue health — the same figures as the admin index: jobs by state (and per tenant), the oldest "
        "READY job's age, expired leases, jobs waiting for review and needing attention, the oldest "
        "unpublished outbox event (age, attempts, last error), quarantined events, overdue timers, unmatched "
        "inbound events and the figures other apps register (external calls in doubt). With --check, exit 1 when there is any problem: the oldest "
        "unpublished event older than --max-outbox-age, anything quarantined, unmatched, overdue, expired, in "
        "doubt, or waiting for review or attention."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument("--check", action="store_true", help="Exit 1 when the queues look unhealthy.")
        parser.add_argument("--max-outbox-age", type=number_flag(minimum=0, maximum=10**9), default=300.0,
                            help="Seconds the oldest unpublished event may wait before --check fails. Default 300.")

    def handle(self, *args, **opts):
        health = queue_health()
        problems = health.problems(max_outbox_age=opts["max_outbox_age"])

        if opts["json"]:
            self.stdout.write(json.dumps({**health.as_dict(), "problems": problems}, default=str))
        else:
            jobs = ", ".join(f"{state} {n}" for state, n in health.jobs.items())
            o, t, i = health.outbox, health.timers, health.inbound
            self.stdout.write(f"jobs:    {jobs}")
            j = health.job_health
            for tenant, states in j.by_tenant.items():
                self.stdout.write(f"  {tenant}: " + ", ".join(f"{s} {n}" for s, n in states.items() if n))
            oldest_ready = ("none waiting" if j.oldest_ready_age_seconds is None
                            else f"oldest {_age(j.oldest_ready_age_seconds)} old")
            self.stdout.write(f"ready:   {oldest_ready}; {j.expired_leases} expired lease(s)")
            self.stdout.write(f"people:  {j.waiting_review} waiting for review, {j.needs_attention} need attention")
            for name, n in health.figures.items():
                self.stdout.write(f"{name.replace('_', ' ')}: {n}")
            oldest = (f"oldest {_age(o.oldest_pending_age_seconds)} old, {o.oldest_pending_attempts} attempt(s)"
                      + (f", last error: {o.oldest_pending_error[:200]}" if o.oldest_pending_error else "")
                      if o.oldest_pending_id else "none waiting")
            self.stdout.write(f"outbox:  {o.pending} pending ({oldest}); {o.quarantined} quarantined")
            self.stdout.write(f"timers:  {t.pending} pending, {t.overdue} overdue"
                              + (f" (oldest {_age(t.oldest_overdue_seconds)} late)" if t.overdue else ""))
            self.stdout.write(f"inbound: {i.unmatched} unmatched"
                              + (f" (oldest {_age(i.oldest_unmatched_age_seconds)} old)" if i.unmatched else ""))
            for problem in problems:
                self.stdout.write(f"PROBLEM: {problem}")
        if opts["check"] and problems:
            raise SystemExit(1)
