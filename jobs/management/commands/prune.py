import json

from django.conf import settings
from django.core.management.base import BaseCommand

from durable.numbers import number_flag, whole_flag
from jobs.retention import retention_sweep

DAYS = number_flag(minimum=0, maximum=36500)


class Command(BaseCommand):
    help = (
        "Retention sweep: redact the payload and request bodies of DONE/CANCELLED jobs finished more than "
        "--redact-after-days ago, delete those finished more than --days ago with their history, external calls "
        "and receipts. Never touches unfinished work or anything live refers to. Bounded batches, each its own "
        "short transaction; prints what it removed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=DAYS, default=None,
                            help=f"Delete finished jobs older than this (default JOBS_RETENTION_DAYS, "
                                 f"{settings.JOBS_RETENTION_DAYS}).")
        parser.add_argument("--redact-after-days", type=DAYS, default=None,
                            help=f"Redact bodies of finished jobs older than this (default JOBS_REDACT_AFTER_DAYS, "
                                 f"{settings.JOBS_REDACT_AFTER_DAYS}; not below --days).")
        parser.add_argument("--batch-size", type=whole_flag(1, 100_000), default=None,
                            help=f"Jobs per batch, 1-100000 (default JOBS_RETENTION_BATCH, "
                                 f"{settings.JOBS_RETENTION_BATCH}).")
        parser.add_argument("--max-batches", type=whole_flag(1, 1_000_000), default=200,
                            help="Batches per phase in this run (at least 1). Default 200.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args, **opts):
        # Every number was range-checked by the parser (`durable.numbers`).
        report = retention_sweep(retention_days=opts["days"], redact_after_days=opts["redact_after_days"],
                                 batch_size=opts["batch_size"], max_batches=opts["max_batches"])
        self.stdout.write(json.dumps(report.as_dict(), sort_keys=True) if opts["json"] else report.summary())
