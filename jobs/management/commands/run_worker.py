import logging

from django.core.management.base import BaseCommand, CommandError

from durable.numbers import number_flag, whole_flag
from jobs.logformat import LogFormatter
from jobs.worker import Worker, WorkerConfig, default_worker_id, name_connections


class Command(BaseCommand):
    help = (
        "Claim and run durable jobs: renews leases while handlers are healthy, recovers expired "
        "leases, wakes due waits and runs the periodic tasks (timers, outbox relay). Stops claiming on "
        "SIGTERM/SIGINT, lets running handlers finish within --grace, then exits 0; a second signal exits "
        "at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--worker-id", default=None,
                            help="A stable identity used in fences and history, for a deployment that runs one "
                                 "process at a time under it (a container orchestrator's stable name): at start the "
                                 "worker takes back at once the leases held under this id, which can only be a "
                                 "previous process's. Never give two running workers the same id. Default: "
                                 "host:pid:start:boot:pidns (or host:pid:random without /proc), new per start; a "
                                 "later worker of the same host takes back a dead one's leases at once.")
        parser.add_argument("--concurrency", type=whole_flag(1, 256), default=1,
                            help="Handlers run at once (threads), 1-256. Default 1.")
        parser.add_argument("--until-idle", action="store_true",
                            help="Exit 0 once nothing is eligible and nothing is running.")
        parser.add_argument("--lease-ttl", type=number_flag(minimum=0.5, maximum=86400), default=30.0,
                            help="Seconds a claim lasts without renewal (0.5-86400); renewed every ttl/3. "
                                 "Default 30.")
        parser.add_argument("--tenant", action="append", dest="tenants", metavar="T",
                            help="Only claim jobs of this tenant (repeatable).")
        parser.add_argument("--action", action="append", dest="actions", metavar="A",
                            help="Only claim jobs of this action (repeatable).")
        parser.add_argument("--grace", type=number_flag(minimum=0, maximum=86400), default=30.0,
                            help="Seconds running handlers get to finish after SIGTERM/SIGINT (0-86400). "
                                 "Default 30.")
        parser.add_argument("--poll-interval", type=number_flag(minimum=0.01, maximum=3600), default=2.0,
                            help="Longest idle sleep between polls when no notification arrives, in seconds "
                                 "(0.01-3600). Default 2.")
        parser.add_argument("--batch", type=whole_flag(1, 1000), default=1, metavar="N",
                            help="Claim up to N jobs at once per slot (one statement), run them one after the "
                                 "other and write their successes together (with the next batch's claim). Each job keeps "
                                 "its own epoch and fence; on shutdown the ones not started are handed back. A "
                                 "batch logs one line per claim and per write (each job's lines at DEBUG). "
                                 "1-1000; default 1.")
        parser.add_argument("--log-format", choices=["text", "json"], default="text",
                            help="One line per event: text (default) or JSON.")
        parser.add_argument("--metrics-port", type=whole_flag(1, 65535), default=None, metavar="PORT",
                            help="Serve this worker's Prometheus counters (jobs by outcome, handler durations) "
                                 "on http://0.0.0.0:PORT/metrics. Default: not served.")

    def handle(self, *args, **opts):
        # Every number was range-checked by the parser (`durable.numbers`).
        handler = logging.StreamHandler(self.stdout._out)
        handler.setFormatter(LogFormatter(opts["log_format"]))
        logger = logging.getLogger("jobs")
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
        config = WorkerConfig(
            worker_id=opts["worker_id"] or default_worker_id(),
            stable_id=opts["worker_id"] is not None,
            concurrency=opts["concurrency"],
            lease_ttl=opts["lease_ttl"],
            tenants=opts["tenants"],
            actions=opts["actions"],
            grace=opts["grace"],
            until_idle=opts["until_idle"],
            poll_interval=opts["poll_interval"],
            batch=opts["batch"],
        )
        if opts["metrics_port"] is not None:
            from jobs.metrics import worker_metrics_serve

            try:
                worker_metrics_serve(opts["metrics_port"])
            except OSError as exc:
                raise CommandError(f"cannot serve metrics on port {opts['metrics_port']}: {exc}") from exc
        name_connections(config.worker_id)
        worker = Worker(config)
        worker.install_signal_handlers()
        code = worker.run()
        if code:
            raise SystemExit(code)
