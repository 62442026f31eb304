import json

from django.core.management.base import BaseCommand

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
        "Show queue health: jobs by state, the oldest unpublished outbox event (age, attempts, last error), "
        "quarantined events, overdue timers and unmatched inbound events. With --check, exit 1 when the "
        "oldest unpublished event is older than --max-outbox-age or anything is quarantined or unmatched."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument("--check", action="store_true", help="Exit 1 when the queues look unhealthy.")
        parser.add_argument("--max-outbox-age", type=float, default=300.0,
                            help="Seconds the oldest unpublished event may wait before --check fails. Default 300.")

    def handle(self, *args, **opts):
        health = queue_health()
        problems = []
        age = health.outbox.oldest_pending_age_seconds
        if age is not None and age > opts["max_outbox_age"]:
            problems.append(f"oldest unpublished outbox event is {_age(age)} old")
        if health.outbox.quarantined:
            problems.append(f"{health.outbox.quarantined} outbox event(s) quarantined")
        if health.inbound.unmatched:
            problems.append(f"{health.inbound.unmatched} inbound event(s) unmatched")

        if opts["json"]:
            self.stdout.write(json.dumps({**health.as_dict(), "problems": problems}, default=str))
        else:
            jobs = ", ".join(f"{state} {n}" for state, n in health.jobs.items())
            o, t, i = health.outbox, health.timers, health.inbound
            self.stdout.write(f"jobs:    {jobs}")
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
