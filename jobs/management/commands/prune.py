import json

from django.conf import settings
from django.core.management.base import BaseCommand

from durable.numbers import number_flag, whole_flag
from jobs.retention import retention_sweep, stop_on_signals

DAYS = number_flag(minimum=0, maximum=36500)


class Command(BaseCommand):
    help = (
        "Retention sweep: redact the payload and request bodies of DONE/CANCELLED jobs finished more than "
        "--redact-after-days ago, delete those finished more than --days ago with their history, external calls "
        "and receipts; on PostgreSQL, creates the history's day partitions ahead and drops old ones no remaining job "
        "has history in. Never touches unfinished work or anything live refers to. Runs until done (or --budget / "
        "--max-batches), in short transactions sized adaptively with a pause after each; prints progress to stderr "
        "and, at the end or when stopped by SIGTERM/SIGINT, what it did."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=DAYS, default=None,
                            help=f"Delete finished jobs older than this (default JOBS_RETENTION_DAYS, "
                                 f"{settings.JOBS_RETENTION_DAYS}).")
        parser.add_argument("--redact-after-days", type=DAYS, default=None,
                            help=f"Redact bodies of finished jobs older than this (default JOBS_REDACT_AFTER_DAYS, "
                                 f"{settings.JOBS_REDACT_AFTER_DAYS}); only when below --days: at or above it "
                                 f"nothing is redacted (those jobs are deleted instead).")
        parser.add_argument("--batch-size", type=whole_flag(1, 100_000), default=None,
                            help=f"Jobs in the first batch, 1-100000 (default JOBS_RETENTION_BATCH, "
                                 f"{settings.JOBS_RETENTION_BATCH}); later batches are sized (50-20000) to take "
                                 f"about JOBS_RETENTION_BATCH_SECONDS ({settings.JOBS_RETENTION_BATCH_SECONDS:g} s) "
                                 f"each.")
        parser.add_argument("--max-batches", type=whole_flag(1, 1_000_000), default=None,
                            help="At most this many batches per phase in this run (default: no limit).")
        parser.add_argument("--budget", type=number_flag(minimum=0, maximum=7 * 86400), default=None,
                            help=f"Stop after this many seconds; the rest is the next run's (default "
                                 f"JOBS_RETENTION_BUDGET_SECONDS, {settings.JOBS_RETENTION_BUDGET_SECONDS:g}; "
                                 f"0: no limit).")
        parser.add_argument("--pause-ratio", type=number_flag(minimum=0, maximum=10_000), default=None,
                            help=f"Pause this many times as long as each batch took, so workers keep the "
                                 f"database (default JOBS_RETENTION_PAUSE_RATIO, "
                                 f"{settings.JOBS_RETENTION_PAUSE_RATIO:g}; 0: no pause).")
        parser.add_argument("--progress-every", type=number_flag(minimum=0.1, maximum=3600), default=10.0,
                            help="Seconds between progress lines on stderr (default 10).")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args, **opts):
        # Every number was range-checked by the parser (`durable.numbers`).
        with stop_on_signals() as stop:
            report = retention_sweep(retention_days=opts["days"], redact_after_days=opts["redact_after_days"],
                                     batch_size=opts["batch_size"], max_batches=opts["max_batches"],
                                     budget_seconds=opts["budget"], pause_ratio=opts["pause_ratio"],
                                     progress=self._progress, progress_every=opts["progress_every"], stop=stop)
        self.stdout.write(json.dumps(report.as_dict(), sort_keys=True) if opts["json"] else report.summary())

    def _progress(self, line: str) -> None:
        self.stderr.write(line)
        self.stderr.flush()
