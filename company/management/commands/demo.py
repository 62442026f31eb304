"""`manage.py demo`: the end-to-end story on the configured database.

1. Demo users for the admin (development passwords).
2. A provider simulator (the outside world, its own storage) that sometimes
   accepts a message and then stalls past the client's read timeout — the
   answer is lost, the message is not.
3. Email jobs through `connectors.send_email`, one with an invalid recipient
   (→ review) and one for an action nobody handles (→ an operator), plus a job
   that waits for a customer reply that arrives later (→ resumed, done).
4. A worker runs until idle; then the story is told from the database and
   from the provider's own listing: one message per email, a receipt for each,
   and how every receipt was obtained.
"""

import logging
import os
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db.models import Count

from connectors.simulator_process import running_simulator
from jobs.models import Job
from jobs.states import State
from jobs.store import JobSpec, Store
from jobs.worker import Worker, WorkerConfig
from operations.selectors import operations_by_state, receipts_by_how

TENANT = "demo"
CUSTOMERS = ["ada@example.com", "grace@example.com", "edsger@example.com", "barbara@example.com",
             "donald@example.com", "frances@example.com"]
DEMO_USERS = [
    # (username, groups, superuser) — development passwords, printed below.
    ("admin", [], True),
    ("operator", ["operators"], False),
    ("reviewer", ["reviewers"], False),
    ("staff", ["staff"], False),
]


class Command(BaseCommand):
    help = (
        "Run the end-to-end story: demo users, a provider simulator that loses some answers, email jobs, "
        "a worker until idle, then a summary of jobs, operations, receipts and the provider's messages. "
        "Development only: it creates users with known passwords."
    )

    def add_arguments(self, parser):
        parser.add_argument("--emails", type=int, default=len(CUSTOMERS), help="Quote emails to send.")
        parser.add_argument("--run", default=time.strftime("%Y%m%d-%H%M%S"),
                            help="Names this run's job keys (a repeated run with the same name changes nothing).")

    def handle(self, *args, **opts):
        password = os.environ.get("DEMO_PASSWORD", "demo-password")
        # The story is told by the summary; per-transition lines are for run_worker.
        logging.getLogger("jobs").setLevel(logging.WARNING)
        self._users(password)
        run = opts["run"]
        store = Store()
        with running_simulator(mode="idempotent", stall_after_accept=1.0, stall_probability=0.35,
                               seed=7) as simulator:
            # The worker in this process talks to the simulator just started.
            settings.PROVIDER_URL = simulator.url
            settings.PROVIDER_READ_TIMEOUT = 0.5
            self.stdout.write(f"provider simulator at {simulator.url} (stalls 35% of answers past the read timeout)")
            emails = [
                JobSpec(TENANT, f"quote-{run}-{i:02d}", action="connectors.send_email",
                        payload={"to": CUSTOMERS[i % len(CUSTOMERS)], "subject": f"Your quote Q-{i:03d}",
                                 "body": "Please find your quote attached."})
                for i in range(opts["emails"])
            ]
            store.enqueue_many(emails)
            store.enqueue(TENANT, f"quote-{run}-typo", action="connectors.send_email",
                          payload={"to": "bob-at-example.com", "subject": "Your quote", "body": "…"})
            store.enqueue(TENANT, f"mystery-{run}", action="demo.not_registered")
            store.enqueue(TENANT, f"reply-{run}", action="demo.await_reply")
            self.stdout.write(f"enqueued {len(emails) + 3} jobs for tenant {TENANT!r}\n")

            self._work_until_settled(run)
            # The customer answers (an inbound event does this over HTTP);
            # a repeated run finds the reply already handled.
            if Job.objects.filter(tenant=TENANT, key=f"reply-{run}", state=State.WAITING_EXTERNAL).exists():
                store.resume(TENANT, f"reply-{run}", reason="customer replied: 'Looks good, go ahead'",
                             actor="demo", detail={"reply": "Looks good, go ahead"})
                self._work_until_settled(run)
            messages = [m for m in simulator.messages() if m["subject"].startswith("Your quote Q-")]
        self._report(run, len(emails), messages, password)

    def _work_until_settled(self, run: str) -> None:
        """Run a worker until idle, again while retries are only waiting for their backoff."""
        for _ in range(60):
            Worker(WorkerConfig(worker_id="demo-worker", concurrency=4, until_idle=True, poll_interval=0.2,
                                lease_ttl=10)).run()
            if not Job.objects.filter(tenant=TENANT, key__contains=run, state__in=[State.READY, State.LEASED]).exists():
                return
            time.sleep(0.5)

    def _report(self, run: str, emails: int, messages: list, password: str) -> None:
        w = self.stdout.write
        jobs = Job.objects.filter(tenant=TENANT, key__contains=run)
        w("\njobs by state:")
        for row in jobs.values("state").annotate(n=Count("id")).order_by("state"):
            w(f"  {row['state']:<18} {row['n']}")
        w("operations by state: " + ", ".join(f"{k} {v}" for k, v in sorted(operations_by_state(tenant=TENANT, job_key_prefix=f"quote-{run}").items())))
        w("receipts by how obtained: " + ", ".join(f"{k} {v}" for k, v in sorted(receipts_by_how(tenant=TENANT, job_key_prefix=f"quote-{run}").items())))
        per_reference = {}
        for message in messages:
            per_reference[message["client_reference"]] = per_reference.get(message["client_reference"], 0) + 1
        w(f"provider holds {len(messages)} quote messages for {emails} quote emails "
          f"(most for one email: {max(per_reference.values(), default=0)})")
        for job in jobs.filter(state__in=[State.WAITING_REVIEW, State.NEEDS_ATTENTION]):
            reason = job.wait_reason or job.last_error
            w(f"  {job.state} {job.key}: {reason}")
        w(f"\nadmin users (password {password!r}): " + ", ".join(u for u, _, _ in DEMO_USERS))

    def _users(self, password: str) -> None:
        User = get_user_model()
        perms = Permission.objects.filter(content_type__app_label__in=["jobs", "operations"])
        for group_name in ("operators", "reviewers", "staff"):
            group, _ = Group.objects.get_or_create(name=group_name)
            group.permissions.set(perms if group_name != "staff" else perms.filter(codename__startswith="view"))
        for username, groups, superuser in DEMO_USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.is_staff = True
            user.is_superuser = superuser
            user.set_password(password)
            user.save()
            user.groups.set(Group.objects.filter(name__in=groups))
