import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.retention import retention_sweep


class Command(BaseCommand):
    help = (
        "Retention sweep: redact the payload and request bodies of DONE/CANCELLED jobs finished more than "
        "--redact-after-days ago, delete those finished more than --days ago with their history, external calls "
        "and receipts. Never touches unfinished work or anything live refers to. Bounded batches, each its own "
        "short transaction; prints what it removed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=None,
                            help=f"Delete finished jobs older than this (default JOBS_RETENTION_DAYS, "
                                 f"{settings.JOBS_RETENTION_DAYS}).")
        parser.add_argument("--redact-after-days", type=float, default=None,
                            help=f"Redact bodies of finished jobs older than this (default JOBS_REDACT_AFTER_DAYS, "
                                 f"{settings.JOBS_REDACT_AFTER_DAYS}; not below --days).")
        parser.add_argument("--batch-size", type=int, default=None,
                            help=f"Jobs per batch (default JOBS_RETENTION_BATCH, {settings.JOBS_RETENTION_BATCH}).")
        parser.add_argument("--max-batches", type=int, default=200, help="Batches per phase in this run. Default 200.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args, **opts):
        for option in ("days", "redact_after_days"):
            if opts[option] is not None and opts[option] < 0:
                raise CommandError(f"--{option.replace('_', '-')} must not be negative")
        if opts["batch_size"] is not None and opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        report = retention_sweep(retention_days=opts["days"], redact_after_days=opts["redact_after_days"],
                                 batch_size=opts["batch_size"], max_batches=opts["max_batches"])
        self.stdout.write(json.dumps(report.as_dict(), sort_keys=True) if opts["json"] else report.summary())
