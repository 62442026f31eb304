from django.core.management.base import BaseCommand

from durable.numbers import whole_flag
from jobs.audit import consistency_audit


class Command(BaseCommand):
    help = (
        "Consistency audit: file stale leases, external calls UNKNOWN past their provider's idempotency retention, "
        "quarantined outbox events and long-overdue timers as NEEDS_ATTENTION items (jobs of action "
        "jobs.audit_finding, key audit-<kind>-<ref>), each once. Prints what it filed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--limit", type=whole_flag(1, 100_000), default=200,
                            help="Most findings per check (1-100000). Default 200.")

    def handle(self, *args, **opts):
        report = consistency_audit(limit=opts["limit"])
        self.stdout.write(report.summary())
        for item in report.items:
            self.stdout.write(f"filed {item}")
