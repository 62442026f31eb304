"""`manage.py chaos`: kill real workers while they send real email, then count.

The claim under test (DESIGN §6): a restart never sends twice and never
loses an obligation. The command starts a provider simulator (its own
temporary storage), enqueues `--jobs` `connectors.send_email` jobs, runs
`--workers` worker processes and SIGKILLs one at random moments `--kills`
times (starting a replacement each time) — and, on PostgreSQL, cuts every
connection the fleet holds `--cut-connections` times, as a database restart
or failover does — then lets one clean worker run until every job has
settled. It then reads the simulator's listing — the
customer-visible effects — and the database, prints the figures and exits
non-zero on any duplicate or lost job.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, connection
from django.db.models import Count, Min
from django.utils import timezone

from connectors.registry import PROVIDER_FOR_SIMULATOR_MODE
from connectors.simulator import MODES
from connectors.simulator_process import running_simulator
from jobs.models import Job
from durable.numbers import number_flag, whole_flag
from jobs.states import State
from jobs.store import JobSpec, Store
from operations.models import IN_DOUBT, Operation, Receipt
from operations.selectors import operations_by_state, receipts_by_how

ACTION = "connectors.send_email"
MANAGE_PY = Path(settings.BASE_DIR) / "manage.py"
# States in which a job still has work ahead of it: not settled yet.
UNSETTLED = (State.READY, State.LEASED)
# Seconds the fleet gets to claim its first job before the run is called off.
STARTUP_LIMIT = 60.0


@dataclass
class Verdict:
    histogram: Counter = field(default_factory=Counter)  # messages per job → how many jobs
    duplicates: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    stray_messages: int = 0

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.lost or self.stray_messages)


SECONDS = number_flag(minimum=0, maximum=3600)
PROBABILITY = number_flag(minimum=0, maximum=1)


class Command(BaseCommand):
    help = (
        "Send --jobs emails through a provider simulator it starts while SIGKILLing real worker processes "
        "(and, with --cut-connections, cutting their database connections) at random moments; then run a "
        "clean worker until idle and report messages and handler attempts per job, the workers' outcome "
        "writes, jobs, operations and receipts. Exits non-zero on any duplicate or lost job."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=whole_flag(1, 100_000), default=50,
                            help="Emails to send (one job each). Default 50.")
        parser.add_argument("--kills", type=whole_flag(0, 10_000), default=10, help="SIGKILLs to deliver. Default 10.")
        parser.add_argument("--cut-connections", type=whole_flag(0, 10_000), default=0, metavar="N",
                            help="PostgreSQL only: N times, at random moments among the kills, terminate every "
                                 "database connection the workers hold (a restart or failover). Default 0.")
        parser.add_argument("--workers", type=whole_flag(1, 64), default=3,
                            help="Worker processes alive at once. Default 3.")
        parser.add_argument("--concurrency", type=whole_flag(1, 256), default=2,
                            help="Handler threads per worker. Default 2.")
        parser.add_argument("--mode", choices=MODES, default="idempotent",
                            help="Simulator mode (and the provider declaring its capabilities). Default idempotent.")
        parser.add_argument("--stall-after-accept", type=SECONDS, default=1.0, metavar="SECONDS",
                            help="Simulator fault: accept, then hold the answer this long. Default 1.0 "
                                 "(past the read timeout).")
        parser.add_argument("--stall-probability", type=PROBABILITY, default=0.3, metavar="P",
                            help="Chance that an accepted message stalls. Default 0.3.")
        parser.add_argument("--error-rate", type=PROBABILITY, default=0.05, metavar="P",
                            help="Chance of a 500 that stores nothing. Default 0.05.")
        parser.add_argument("--throttle-rate", type=PROBABILITY, default=0.05, metavar="P",
                            help="Chance of a 429 with Retry-After. Default 0.05.")
        parser.add_argument("--lease-ttl", type=number_flag(minimum=0.5, maximum=86400), default=1.5,
                            help="Workers' lease ttl: how soon a killed worker's job is recovered. Default 1.5.")
        parser.add_argument("--read-timeout", type=number_flag(above=0, maximum=3600), default=0.5,
                            help="Workers' PROVIDER_READ_TIMEOUT in seconds. Default 0.5.")
        parser.add_argument("--seed", type=whole_flag(0), default=None, help="Seed for kill timing, victims and faults.")
        parser.add_argument("--tenant", default="chaos", help="Tenant of the jobs. Default chaos.")
        parser.add_argument("--deadline", type=number_flag(above=0, maximum=86400), default=300.0,
                            help="Give up waiting for jobs to settle after this many seconds. Default 300.")
        parser.add_argument("--keep-logs", action="store_true",
                            help="Keep the worker and simulator logs even when the run is clean.")

    def handle(self, *args, **opts):
        # Every number was range-checked by the parser (`durable.numbers`).
        if opts["cut_connections"] and connection.vendor != "postgresql":
            raise CommandError("--cut-connections needs PostgreSQL (DATABASE_URL=postgres://…)")
        seed = opts["seed"] if opts["seed"] is not None else random.randrange(1_000_000)
        rng = random.Random(seed)
        run = f"chaos-{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
        prefix = f"{run}-"
        workdir = Path(tempfile.mkdtemp(prefix=f"{run}-"))
        started = time.monotonic()
        self.deadline = started + opts["deadline"]
        self.opts, self.rng, self.workdir, self.prefix, self.tenant = opts, rng, workdir, prefix, opts["tenant"]
        self.launched = 0
        self.children: list[subprocess.Popen] = []
        if opts["cut_connections"]:
            self.since = self._read(_database_now)

        sim_options = {
            "stall_after_accept": opts["stall_after_accept"], "stall_probability": opts["stall_probability"],
            "error_rate": opts["error_rate"], "throttle_rate": opts["throttle_rate"], "seed": seed,
        }
        with running_simulator(opts["mode"], db_path=workdir / "provider.sqlite3", quiet=True, **sim_options) as sim:
            self.env = {
                **os.environ,
                "PROVIDER_URL": sim.url,
                "PROVIDER_READ_TIMEOUT": str(opts["read_timeout"]),
                "PROVIDER_CONNECT_TIMEOUT": "1.0",
                "PYTHONUNBUFFERED": "1",
            }
            # A SIGTERM to this command ends it through the `finally` below.
            previous = signal.signal(signal.SIGTERM, _interrupted)
            try:
                self._enqueue(PROVIDER_FOR_SIMULATOR_MODE[opts["mode"]])
                kills, cuts = self._chaos_phase()
                self._clean_phase()
            finally:
                # However the run ends (an error, Ctrl-C), no worker outlives it.
                self._stop_children()
                signal.signal(signal.SIGTERM, previous)
            messages = sim.messages()
        elapsed = time.monotonic() - started

        verdict = self._read(lambda: self._judge(messages))
        self._report(verdict, messages, kills=kills, cuts=cuts, seed=seed, run=run, elapsed=elapsed)
        if verdict.ok and not opts["keep_logs"]:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            self.stdout.write(f"logs: {workdir}")
        if not verdict.ok:
            raise CommandError(
                f"chaos found {len(verdict.duplicates)} duplicated job(s), {len(verdict.lost)} lost job(s) and "
                f"{verdict.stray_messages} message(s) without an intent (seed {seed})"
            )

    # ------------------------------------------------------------ phases

    def _enqueue(self, provider: str) -> None:
        specs = [
            JobSpec(self.tenant, f"{self.prefix}{i:05d}", action=ACTION, payload={
                "to": f"customer-{i}@example.com",
                "subject": f"Chaos {self.prefix}{i:05d}",
                "body": "If this arrives twice, the chaos test failed.",
                "provider": provider,
            })
            for i in range(self.opts["jobs"])
        ]
        Store().enqueue_many(specs, actor="chaos")

    def _chaos_phase(self) -> tuple[int, int]:
        """Run the fleet, kill workers and cut connections at random
        moments; returns the kills and cuts delivered."""
        workers = [self._start_worker() for _ in range(self.opts["workers"])]
        # The first kill is only interesting once work is in flight.
        give_up = min(self.deadline, time.monotonic() + STARTUP_LIMIT)
        while not self._anything_started():
            if time.monotonic() > give_up or all(worker.poll() is not None for worker in workers):
                for worker in workers:
                    worker.kill()
                    worker.wait()
                raise CommandError(f"no worker claimed a job within {STARTUP_LIMIT:g}s; see the logs in {self.workdir}")
            time.sleep(0.05)
        faults = ["kill"] * self.opts["kills"] + ["cut"] * self.opts["cut_connections"]
        self.rng.shuffle(faults)
        delivered = Counter()
        for fault in faults:
            if not self._unsettled() or time.monotonic() >= self.deadline:
                break
            time.sleep(self.rng.uniform(0.05, 0.5))
            if fault == "cut":
                delivered["cut"] += bool(self._cut_connections())
                continue
            victim = self.rng.choice(workers)
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                delivered["kill"] += 1
            victim.wait()
            workers[workers.index(victim)] = self._start_worker()
        self._stop_children()
        return delivered["kill"], delivered["cut"]

    def _cut_connections(self) -> int:
        """Terminate every connection to this database opened since the run
        began but this command's own — the fleet's claim, heartbeat and
        LISTEN connections; returns how many."""

        def cut():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND backend_start >= %s",
                    [self.since],
                )
                return cursor.fetchone()[0]

        return self._read(cut)

    def _clean_phase(self) -> None:
        """One clean worker until idle, again as long as jobs are merely
        not due yet (a retry's backoff, a dead worker's unexpired lease)."""
        while time.monotonic() < self.deadline:
            worker = self._start_worker("--until-idle")
            try:
                worker.wait(timeout=max(1.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            if not self._unsettled():
                return
            time.sleep(min(2.0, max(0.05, self._seconds_until_due())))

    def _start_worker(self, *extra: str) -> subprocess.Popen:
        self.launched += 1
        name = f"{self.prefix}w{self.launched:03d}"
        log = open(self.workdir / f"worker-{self.launched:03d}.log", "w")  # noqa: SIM115 - owned by the child
        command = [
            sys.executable, str(MANAGE_PY), "run_worker", "--worker-id", name, "--tenant", self.tenant,
            "--action", ACTION, "--lease-ttl", str(self.opts["lease_ttl"]),
            "--concurrency", str(self.opts["concurrency"]), "--poll-interval", "0.2", "--grace", "5", *extra,
        ]
        # Logs go to files, never pipes: nobody drains a pipe while we kill.
        process = subprocess.Popen(command, env=self.env, cwd=settings.BASE_DIR, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.children.append(process)
        return process

    def _stop_children(self) -> None:
        """SIGTERM every worker still running, then SIGKILL those that do
        not exit within their grace; every one is waited for."""
        alive = [child for child in self.children if child.poll() is None]
        for child in alive:
            child.send_signal(signal.SIGTERM)
        for child in alive:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    # ------------------------------------------------------------ reading the database

    def _read(self, read):
        """`read()`, retried while the database is away (a failover, a
        restart: the connection breaks, the new primary is not up yet),
        reconnecting each time, until the run's deadline."""
        failures = 0
        while True:
            try:
                return read()
            except (OperationalError, InterfaceError) as exc:
                failures += 1
                if time.monotonic() >= self.deadline:
                    raise
                self.stderr.write(f"the database is away ({str(exc).strip()[:200]}); reconnecting")
                connection.close()
                time.sleep(min(2.0, 0.05 * 2 ** failures))

    def _jobs(self):
        return Job.objects.filter(tenant=self.tenant, key__startswith=self.prefix)

    def _anything_started(self) -> bool:
        return self._read(lambda: self._jobs().exclude(state=State.READY).exists()
                          or self._jobs().filter(attempts__gt=0).exists())

    def _unsettled(self) -> int:
        return self._read(lambda: self._jobs().filter(state__in=UNSETTLED).count())

    def _seconds_until_due(self) -> float:
        due = self._read(lambda: self._jobs().filter(state__in=UNSETTLED).aggregate(
            retry=Min("next_attempt_at"), lease=Min("lease_until")
        ))
        times = [t for t in due.values() if t is not None]
        if not times:
            return 0.0
        return (min(times) - timezone.now()).total_seconds()

    # ------------------------------------------------------------ verdict and report

    def _judge(self, messages: list[dict]) -> Verdict:
        """Per job: how many customer-visible messages, and is its state explained?

        DONE must come with exactly one message and its receipt. A job an
        operator must look at is explained only in bare mode with its
        operation in doubt: that provider can never tell us what became of
        a lost answer. Anything else is lost.
        """
        can_reconcile = self.opts["mode"] != "bare"
        verdict = Verdict()
        operations = {
            op.intent_key: op
            for op in Operation.objects.filter(job__tenant=self.tenant, job__key__startswith=self.prefix)
        }
        per_operation = Counter()
        for message in messages:
            if message["client_reference"] in operations:
                per_operation[message["client_reference"]] += 1
            else:
                verdict.stray_messages += 1
        by_job = {op.job_id: op for op in operations.values()}
        receipts = {
            r.operation_id: r
            for r in Receipt.objects.filter(
                operation__job__tenant=self.tenant, operation__job__key__startswith=self.prefix
            )
        }
        listing = {m["id"] for m in messages}
        for job in self._jobs():
            op = by_job.get(job.pk)
            count = per_operation[op.intent_key] if op else 0
            verdict.histogram[count] += 1
            if count > 1:
                verdict.duplicates.append((job.key, f"{count} messages"))
            receipt = receipts.get(op.id) if op else None
            if job.state == State.DONE:
                if count == 0 or receipt is None or receipt.provider_reference not in listing:
                    verdict.lost.append((job.key, f"DONE with {count} message(s) and receipt {receipt}"))
            elif job.state == State.NEEDS_ATTENTION and op is not None and op.state in IN_DOUBT and not can_reconcile:
                pass  # an operator must find out; the mode explains it
            else:
                verdict.lost.append((job.key, f"{job.state}: {job.last_error[:200]}"))
        return verdict

    def _report(self, verdict: Verdict, messages, *, kills: int, cuts: int, seed: int, run: str,
                elapsed: float) -> None:
        o = self.opts
        jobs_by_state = Counter(dict(self._jobs().values_list("state").annotate(n=Count("id")).order_by()))
        write = self.stdout.write
        write(f"chaos run {run}: {o['jobs']} jobs, mode {o['mode']}, {o['workers']} workers x{o['concurrency']}, "
              f"kills {kills}/{o['kills']}, connections cut {cuts}/{o['cut_connections']}, "
              f"lease ttl {o['lease_ttl']}s, read timeout {o['read_timeout']}s, seed {seed}")
        write(f"simulator faults: stall {o['stall_after_accept']}s p={o['stall_probability']}, "
              f"error rate {o['error_rate']}, throttle rate {o['throttle_rate']}")
        write("messages per job (histogram):")
        for count in sorted(verdict.histogram):
            write(f"  {count} message(s): {verdict.histogram[count]} job(s)")
        write(f"messages accepted by the provider: {len(messages)}")
        write("handler attempts per job (histogram): "
              + _counts(Counter(dict(self._jobs().values_list("attempts").annotate(n=Count("id")).order_by()))))
        write("worker writes: " + _counts(self._writes_in_logs()))
        write("jobs by state: " + _counts(jobs_by_state))
        write("operations by state: "
              + _counts(operations_by_state(tenant=self.tenant, job_key_prefix=self.prefix)))
        write("receipts by how: " + _counts(receipts_by_how(tenant=self.tenant, job_key_prefix=self.prefix)))
        for key, why in verdict.duplicates[:20]:
            write(f"  DUPLICATE {key}: {why}")
        for key, why in verdict.lost[:20]:
            write(f"  LOST {key}: {why}")
        write(f"duplicates: {len(verdict.duplicates)}  lost: {len(verdict.lost)}  "
              f"stray messages: {verdict.stray_messages}")
        write(f"chaos: {'OK' if verdict.ok else 'FAILED'} in {elapsed:.1f}s")


    def _writes_in_logs(self) -> Counter:
        """How the workers' outcome writes went, from their logs: in doubt
        after a broken connection, given up, lost to a moved fence."""
        found = Counter()
        for log in self.workdir.glob("worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                for event in ("job.write_in_doubt", "job.write_failed", "job.fence_lost"):
                    if f" {event} " in line:
                        found[event.removeprefix("job.")] += 1
        return found


def _counts(counter: Counter) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items())) or "none"


def _database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")  # the database's clock, as pg_stat_activity's
        return cursor.fetchone()[0]


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
