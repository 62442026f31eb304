"""A failover drill on private clusters (`proving.clusters`): real worker
processes on a libpq multi-host URL work through no-op jobs and emails sent
to a provider simulator, the primary is stopped as in a crash
(`pg_ctl stop -m immediate`) and its streaming standby promoted; the
workers must find the new primary by themselves and finish every job.

Each round starts a fresh standby of the current primary, enqueues its own
jobs, crashes the primary once a share of them is done, promotes the
standby (the next round's primary) and counts, from the new primary, the
simulator's listing and the workers' logs:

- lost: jobs not DONE when the round gave up waiting, and DONE emails the
  provider never received;
- run twice: jobs a worker claimed more than once (a handler runs at least
  once; a commit lost with the old primary makes it visible);
- sent twice: emails the provider received more than once;
- resume: seconds from the promotion to the first job finished after it.

The drill drives the application only through processes (`manage.py
migrate`, `shell`, `run_worker`) and reads the clusters with psycopg, so it
runs from any process, Django's own database being whatever it is.
"""

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from proving.clusters import Cluster, PrivateClusters, multi_host_url
from proving.processes import ROOT, manage, terminate

TENANT = "failover"
NOOP = "jobs.bench_noop"
EMAIL = "connectors.send_email"
ENQUEUE = """
import json, os
from jobs.store import JobSpec, Store
specs = [JobSpec(**spec) for spec in json.loads(os.environ["FAILOVER_JOB_SPECS"])]
Store().enqueue_many(specs, actor="failover-drill")
"""


@dataclass
class RoundResult:
    number: int
    jobs: int
    emails: int
    lost: list = field(default_factory=list)
    run_twice: list = field(default_factory=list)
    sent_twice: list = field(default_factory=list)
    done_at_crash: int = 0
    done_lost: int = 0  # DONE on the old primary at the crash, not on the new one
    resume_seconds: float | None = None
    outage_seconds: float | None = None

    def line(self) -> str:
        resume = "never"
        if self.resume_seconds is not None:
            resume = f"{self.resume_seconds:.2f}s after the promotion ({self.outage_seconds:.2f}s after the crash)"
        emails_again = sum("-mail-" in key for key in self.run_twice)
        return (f"round {self.number}: {self.jobs} jobs ({self.emails} emails, {self.done_at_crash} done at the "
                f"crash, {self.done_lost} of them not on the new primary), lost {len(self.lost)}, "
                f"run twice {len(self.run_twice)} ({emails_again} emails), sent twice {len(self.sent_twice)}, "
                f"resumed {resume}")


class FailoverDrill:
    """Rounds of crash-and-promote under a running fleet. `messages` reads
    the provider's listing (`SimulatorHandle.messages`)."""

    def __init__(self, clusters: PrivateClusters, *, simulator_url: str, messages: Callable[[], list[dict]],
                 workdir: Path, dbname: str = "durable_failover", synchronous: bool = False, workers: int = 3,
                 concurrency: int = 2, lease_ttl: float = 5.0, deadline: float = 90.0):
        self.clusters, self.simulator_url, self.messages = clusters, simulator_url, messages
        self.workdir, self.dbname, self.synchronous = workdir, dbname, synchronous
        self.workers, self.concurrency, self.lease_ttl, self.deadline = workers, concurrency, lease_ttl, deadline
        self.primary: Cluster | None = None
        self.rounds = 0

    def prepare(self) -> None:
        """The first primary, with the application's database migrated."""
        self.primary = self.clusters.primary(name="node-0")
        self.primary.query(f'CREATE DATABASE "{self.dbname}"')
        self._manage(self.primary.url(self.dbname), "migrate", "--noinput", "-v", "0")

    def round(self, *, jobs: int = 120, emails: int = 30, crash_after: float = 0.3,
              lose_after: float | None = None) -> RoundResult:
        """One round: `jobs` no-op jobs and `emails` emails; the primary is
        crashed once `crash_after` of them are DONE. With `lose_after`
        (asynchronous only) the standby stops receiving WAL once that share
        is DONE, so the commits between then and the crash are lost in the
        failover."""
        if lose_after is not None and self.synchronous:
            raise ValueError("a synchronous standby that stops receiving WAL stops the primary's commits")
        self.rounds += 1
        number, primary = self.rounds, self.primary
        standby = self.clusters.standby(primary, name=f"node-{number}", synchronous=self.synchronous)
        url = multi_host_url([primary, standby], self.dbname, connect_timeout="2")
        prefix = f"r{number}-"
        noops = [{"tenant": TENANT, "key": f"{prefix}noop-{i:04d}", "action": NOOP, "payload": {"hold": 0.05}}
                 for i in range(jobs)]
        mails = [{"tenant": TENANT, "key": f"{prefix}mail-{i:04d}", "action": EMAIL,
                  "payload": {"to": f"customer-{i}@example.com", "subject": f"Failover {prefix}{i:04d}",
                              "body": "If this arrives twice, the failover drill failed.",
                              "provider": "sim-idempotent"}}
                 for i in range(emails)]
        # Emails spread evenly among the no-ops (claims go oldest first), so
        # some are in flight, and some just finished, whenever the primary crashes.
        order = [(i / jobs, spec) for i, spec in enumerate(noops)] + [((i + 0.5) / emails, spec)
                                                                     for i, spec in enumerate(mails)]
        specs = [spec for _, spec in sorted(order, key=lambda pair: pair[0])]
        self._manage(primary.url(self.dbname), "shell", "-c", ENQUEUE, FAILOVER_JOB_SPECS=json.dumps(specs))
        total = jobs + emails
        fleet = [self._start_worker(url, number, w) for w in range(self.workers)]
        try:
            give_up = time.monotonic() + self.deadline
            steps = [(lose_after, standby.stop_streaming)] if lose_after is not None else []
            for share, then in steps + [(crash_after, None)]:
                while self._done(primary, prefix) < share * total:
                    if time.monotonic() > give_up:
                        raise RuntimeError(f"round {number}: the fleet did not get going; logs in {self.workdir}")
                    time.sleep(0.02)
                if then is not None:
                    then()
            done_at_crash = self._done(primary, prefix)
            crashed_at = standby.query("SELECT clock_timestamp()")[0][0]
            primary.stop(mode="immediate")
            done_on_standby = self._done(standby, prefix)  # all it replayed; nothing runs on it yet
            standby.promote()
            self.primary = standby
            promoted_at = standby.query("SELECT clock_timestamp()")[0][0]
            give_up = time.monotonic() + self.deadline
            while self._done(standby, prefix) < total and time.monotonic() < give_up:
                time.sleep(0.1)
        finally:
            terminate(fleet)
        result = self._judge(number, standby, prefix, jobs=total, emails=emails, promoted_at=promoted_at)
        result.done_at_crash = done_at_crash
        result.done_lost = max(0, done_at_crash - done_on_standby)
        if result.resume_seconds is not None:
            result.outage_seconds = result.resume_seconds + (promoted_at - crashed_at).total_seconds()
        return result

    # ------------------------------------------------------------ counting

    def _judge(self, number: int, primary: Cluster, prefix: str, *, jobs: int, emails: int,
               promoted_at) -> RoundResult:
        result = RoundResult(number=number, jobs=jobs, emails=emails)
        rows = primary.query("SELECT key, state, finished_at FROM jobs_job WHERE tenant = %s AND key LIKE %s",
                             [TENANT, prefix + "%"], dbname=self.dbname)
        sent = Counter(m["subject"].removeprefix("Failover ") for m in self.messages()
                       if m.get("subject", "").startswith(f"Failover {prefix}"))
        for key, state, _ in rows:
            if state != "DONE":
                result.lost.append((key, state))
            elif "-mail-" in key and not sent[key.replace("mail-", "")]:
                result.lost.append((key, "DONE without a message"))
        result.lost += [(f"{prefix}?", "missing") for _ in range(jobs - len(rows))]
        result.sent_twice = sorted(k for k, n in sent.items() if n > 1)
        claims = Counter()
        for log in self.workdir.glob(f"round-{number}-worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"job.claim"' in line:
                    record = json.loads(line)
                    if record.get("event") == "job.claim" and record.get("key", "").startswith(prefix):
                        claims[record["key"]] += 1
        result.run_twice = sorted(k for k, n in claims.items() if n > 1)
        after = [finished for _, state, finished in rows if finished is not None and finished >= promoted_at]
        if after:
            result.resume_seconds = (min(after) - promoted_at).total_seconds()
        return result

    def _done(self, cluster: Cluster, prefix: str) -> int:
        try:
            return cluster.query("SELECT count(*) FROM jobs_job WHERE tenant = %s AND key LIKE %s AND state = 'DONE'",
                                 [TENANT, prefix + "%"], dbname=self.dbname)[0][0]
        except psycopg.OperationalError:
            return 0

    # ------------------------------------------------------------ processes

    def _env(self, url: str) -> dict:
        return {"DATABASE_URL": url, "PROVIDER_URL": self.simulator_url, "PYTHONUNBUFFERED": "1",
                "PROVIDER_READ_TIMEOUT": "2", "PROVIDER_CONNECT_TIMEOUT": "1"}

    def _manage(self, url: str, *args: str, **env: str) -> None:
        manage(*args, env={**self._env(url), **env})

    def _start_worker(self, url: str, number: int, index: int) -> subprocess.Popen:
        log = open(self.workdir / f"round-{number}-worker-{index}.log", "w")  # noqa: SIM115 - owned by the child
        command = [sys.executable, str(ROOT / "manage.py"), "run_worker", "--worker-id", f"r{number}-w{index}",
                   "--tenant", TENANT, "--concurrency", str(self.concurrency), "--lease-ttl", str(self.lease_ttl),
                   "--poll-interval", "0.2", "--grace", "5", "--log-format", "json"]
        process = subprocess.Popen(command, env={**os.environ, **self._env(url)}, cwd=ROOT, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        return process
