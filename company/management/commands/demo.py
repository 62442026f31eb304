"""`manage.py demo` (what `make demo` runs): the company loop told end to end.

1. Development users (created only when missing; an existing user is never
   changed) with memberships in the demo tenant (contract C4).
2. `seed_demo`: customers, overdue invoices, approved quotes — all through the
   services, so the work flows through the outbox.
3. Invoices change before their reminders come due: one is paid, one
   customer suppresses reminders, one due date moves a few weeks out.
4. A provider simulator that accepts a message and then stalls past the
   client's read timeout; a worker process is killed with SIGKILL right after
   the provider accepted the first quote email; a new worker takes over and
   reconciles instead of resending.
5. A customer accepts one quote and declines another (signed inbound
   events); the third quote's follow-up timer fires and proposes a follow-up
   for review; the rules agent runs twice (the second run proposes nothing).
6. The proof, from the database and the provider's own listing. Then the
   admin is served with the worker and the simulator still running, so an
   approval in the browser really runs (`DEMO_SERVE=0`: no serving). Ctrl-C
   stops all of them.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from company.models import Invoice, Membership, Quote
from company.names import AGENT_RUN, agent_run_key, invoice_reminder_key, quote_send_key
from company.replies import quote_reply_post
from company.services import (
    customer_suppress,
    invoice_change_terms,
    invoice_record_payment,
    tenant_ensure,
    tenant_policy_set,
)
from connectors.simulator_process import running_simulator
from durable.numbers import whole_flag
from jobs.models import InboundEvent, Job, Timer
from jobs.outbox import outbox_relay
from jobs.states import State
from jobs.store import Store
from operations.models import Operation

from .seed_demo import invoice_number, quote_number, seed

ROOT = Path(settings.BASE_DIR) if hasattr(settings, "BASE_DIR") else Path(__file__).resolve().parents[3]
REPLY_PROVIDER = "mailer"
EMAIL_PROVIDER = "sim-lookup"
DEMO_USERS = [
    # (username, group, membership role, superuser)
    ("admin", None, None, True),
    ("reviewer", "reviewers", Membership.Role.REVIEWER, False),
    ("operator", "operators", Membership.Role.OPERATOR, False),
    ("staff", "viewers", Membership.Role.VIEWER, False),
]
LEASE_TTL = 2.0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = (
        "Tell the company loop end to end on the configured database: seed a tenant, send quote emails through "
        "a provider simulator that loses answers, SIGKILL a worker right after the provider accepted an email, "
        "resume with a new worker, let a reply and a follow-up timer arrive, remind invoices, run the rules "
        "agent, print the proof, then serve the admin on 127.0.0.1:8000 with a worker and the simulator behind "
        "it until Ctrl-C (DEMO_SERVE=0 skips serving). Development only: creates users admin, reviewer, "
        "operator, staff (password DEMO_PASSWORD, default demo-password) when they do not exist; refuses to "
        "run with DURABLE_PRODUCTION=1."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo", help="Tenant slug (default: demo).")
        parser.add_argument("--port", type=whole_flag(1, 65535), default=8000,
                            help="Port the admin is served on (default: 8000).")

    def handle(self, *args, **opts):
        if getattr(settings, "PRODUCTION", False) or os.environ.get("DURABLE_PRODUCTION") == "1":
            raise CommandError("the demo creates users with known passwords; it refuses to run with "
                               "DURABLE_PRODUCTION=1")
        self.tenant_slug = opts["tenant"]
        self.children: list[subprocess.Popen] = []
        self.secret = (getattr(settings, "INBOUND_WEBHOOK_SECRETS", None) or {}).get(REPLY_PROVIDER) or "demo-secret"
        settings.INBOUND_WEBHOOK_SECRETS = {**(settings.INBOUND_WEBHOOK_SECRETS or {}), REPLY_PROVIDER: self.secret}
        settings.INBOUND_PROVIDER_TENANTS = {**(getattr(settings, "INBOUND_PROVIDER_TENANTS", None) or {}),
                                             REPLY_PROVIDER: [self.tenant_slug]}
        password = os.environ.get("DEMO_PASSWORD", "demo-password")
        started = time.monotonic()
        # A `kill` stops the demo like Ctrl-C does: its processes go with it.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            # The provider keeps its storage next to the database, so a repeated
            # run still shows what it accepted; a fresh story starts it empty.
            # (DEMO_STATE_DIR, default var/ in the project: tests point it elsewhere.)
            state_dir = Path(os.environ.get("DEMO_STATE_DIR") or ROOT / "var")
            provider_db = state_dir / f"demo-provider-{self.tenant_slug}.sqlite3"
            provider_db.parent.mkdir(parents=True, exist_ok=True)
            if not Quote.objects.filter(tenant__slug=self.tenant_slug).exists():
                for stale in provider_db.parent.glob(provider_db.name + "*"):
                    stale.unlink()
            with running_simulator(mode="lookup", db_path=provider_db, stall_after_accept=10,
                                   stall_probability=1.0, quiet=True) as simulator:
                self.env = {
                    **os.environ, "PYTHONUNBUFFERED": "1", "PROVIDER_URL": simulator.url,
                    "OPERATIONS_DEFAULT_EMAIL_PROVIDER": EMAIL_PROVIDER,
                    "INBOUND_WEBHOOK_SECRETS": f"{REPLY_PROVIDER}={self.secret}",
                    "INBOUND_PROVIDER_TENANTS": f"{REPLY_PROVIDER}={self.tenant_slug}",
                }
                self._story(simulator, opts, password)
                self.stdout.write(f"\nthe story took {time.monotonic() - started:.0f}s")
                if os.environ.get("DEMO_SERVE", "1") != "0":
                    self._serve(opts["port"])
        except KeyboardInterrupt:
            self.stdout.write("\nstopping the worker, the simulator and the server")
        finally:
            self._stop_children()

    # ------------------------------------------------------------ the story

    def _story(self, simulator, opts, password: str) -> None:
        w = self.stdout.write
        slug = self.tenant_slug
        users = self._users(password)
        result = seed(tenant_slug=slug, quotes=3, invoices=5)
        tenant = result["tenant"]
        w(f"1. seeded tenant {slug!r}: approved {result['quotes_approved']} quote(s), issued "
          f"{result['invoices_issued']} invoice(s) through the services (each change with its outbox event)")
        if not result["quotes_approved"]:
            w("   nothing new: this database has told the story before; the proof below is read from it and "
              "from the provider's storage")
            self._start_worker("demo-worker-2", read_timeout=0.5)
            self._report(simulator, users, password)
            return
        # Reminders 6 days after the due date: due now for all seeded invoices
        # but the most recent one, which the agent proposes to remind early.
        tenant_policy_set(tenant=tenant, quote_follow_up_after=timedelta(days=3),
                          invoice_reminder_after=timedelta(days=6))
        # Relay here so the reminder timers exist before the invoices change.
        while outbox_relay():
            pass
        if result["invoices_issued"]:
            self._change_invoices(tenant)

        w(f"2. provider simulator at {simulator.url} (mode lookup: it can look a message up by the client's "
          "reference; every answer stalls 10 s, longer than the worker waits)")
        first = self._start_worker("demo-worker-1", read_timeout=5, concurrency=1)
        self._kill_after_acceptance(simulator, first)
        second = self._start_worker("demo-worker-2", read_timeout=0.5)
        w("   started demo-worker-2")
        quote_keys = [quote_send_key(quote_number(i)) for i in (1, 2, 3)]
        self._wait(lambda: all(self._job(k) and self._job(k).state not in (State.READY, State.LEASED)
                               for k in quote_keys), "the quote emails to be sent", timeout=90)

        self._reply(quote_number(1), "accept", "evt-demo-1")
        self._reply(quote_number(3), "decline", "evt-demo-3")
        w(f"3. customers replied (signed events to /hooks/{REPLY_PROVIDER}/events): {quote_number(1)} accept, "
          f"{quote_number(3)} decline; {quote_number(2)} gets no reply")
        # The follow-up is due three days after sending; the demo does not wait that long.
        moved = Timer.objects.filter(tenant=slug, job__key=quote_send_key(quote_number(2)),
                                     state=Timer.Status.PENDING).update(scheduled_for=timezone.now())
        if moved:
            w(f"   {quote_number(2)}'s follow-up timer (due in 3 days) is moved to now, so it fires")
        store = Store()
        for run in ("1", "2"):
            store.enqueue(slug, agent_run_key(f"{timezone.now():%Y%m%d%H%M%S}-{run}"), action=AGENT_RUN,
                          actor="demo", reason="the rules agent looks for work")
            self._wait(lambda: not Job.objects.filter(tenant=slug, action=AGENT_RUN,
                                                      state__in=[State.READY, State.LEASED]).exists(),
                       "the agent run", timeout=60)
        self._wait(self._settled, "replies, timers and reminders to settle", timeout=90)
        if second.poll() is not None:
            raise CommandError(f"demo-worker-2 exited with status {second.returncode}")
        self._report(simulator, users, password)

    def _change_invoices(self, tenant) -> None:
        invoices = {i.number: i for i in Invoice.objects.filter(tenant=tenant)}
        paid = invoices[invoice_number(2)]
        invoice_record_payment(invoice=paid, amount=paid.balance, actor="bank transfer")
        suppressed = invoices[invoice_number(3)]
        customer_suppress(customer=suppressed.customer, reason="disputes the invoice", actor="accounts")
        moved = invoices[invoice_number(4)]
        invoice_change_terms(invoice=moved, due_date=timezone.now().date() + timedelta(days=21), terms="Net 60",
                             actor="accounts")
        self.stdout.write(f"   before the reminders came due: {paid.number} was paid, {suppressed.customer.email} "
                          f"suppressed reminders ({suppressed.number}), {moved.number} got a new due date")

    def _kill_after_acceptance(self, simulator, worker: subprocess.Popen) -> None:
        self._wait(lambda: simulator.messages(), "the provider to accept the first email", timeout=60)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        message = simulator.messages()[0]
        op = Operation.objects.select_related("job").filter(pk=message["client_reference"]).first()
        key = op.job.key if op else "?"
        self.stdout.write(f"   the provider accepted {message['subject']!r} (for {key}); demo-worker-1 was killed "
                          f"with SIGKILL before the answer reached it (its operation is {op.state if op else '?'})")
        job = self._job(key)
        if job is not None and job.lease_until is not None:
            time.sleep(max(0.0, (job.lease_until - timezone.now()).total_seconds()) + 0.1)

    def _settled(self) -> bool:
        slug = self.tenant_slug
        busy = Job.objects.filter(tenant=slug, state__in=[State.READY, State.LEASED]).exists()
        follow_up_pending = Timer.objects.filter(tenant=slug, state=Timer.Status.PENDING, reason="quote follow-up",
                                                 job__state=State.WAITING_EXTERNAL).exists()
        due_timers = Timer.objects.filter(tenant=slug, state=Timer.Status.PENDING,
                                          scheduled_for__lte=timezone.now()).exists()
        return not (busy or follow_up_pending or due_timers)

    # ------------------------------------------------------------ the proof

    def _report(self, simulator, users: dict, password: str) -> None:
        w = self.stdout.write
        slug = self.tenant_slug
        messages = simulator.messages()
        by_reference: dict[str, list] = {}
        for m in messages:
            by_reference.setdefault(m["client_reference"], []).append(m)
        w("\nQuotes")
        for quote in Quote.objects.filter(tenant__slug=slug).select_related("customer").order_by("number"):
            job = self._job(quote_send_key(quote.number))
            ops = list(Operation.objects.filter(job=job).select_related("receipt")) if job else []
            emails = sum(len(by_reference.get(str(op.pk), [])) for op in ops if op.step == "send")
            receipts = ", ".join(self._receipt(op) for op in ops if op.step == "send") or "no operation"
            w(f"  {quote.number} to {quote.customer.email}: {quote.status}; emails at the provider: {emails}; "
              f"receipt: {receipts}; job {job.key if job else '-'} {job.state if job else ''}")
            if job is not None and job.events.filter(kind__in=["recover", "takeover"]).exists():
                workers = ", ".join(sorted(set(job.events.filter(kind="claim").values_list("worker_id", flat=True))))
                hows = {op.receipt.how for op in ops if op.step == "send" and hasattr(op, "receipt")}
                how = f"reconciled by {', '.join(sorted(hows))} instead of sending blind" if hows else \
                    "could not reconcile it (see the operation)"
                w(f"    resumed: its worker died holding it; the job was recovered and finished by another worker "
                  f"(claimed by {workers}), which {how}")
            follow_up = (job.result or {}).get("follow_up") if job is not None else None
            if follow_up:
                w(f"    no reply before the follow-up timer: proposed {follow_up} for review")
        w("\nInvoices")
        for invoice in Invoice.objects.filter(tenant__slug=slug).select_related("customer").order_by("number"):
            w(f"  {invoice.number} ({invoice.customer.email}, due {invoice.due_date}, balance {invoice.balance}): "
              f"{self._reminder_story(invoice)}")
        inbound = InboundEvent.objects.filter(provider=REPLY_PROVIDER, tenant=slug).count()
        w(f"\nInbound reply events recorded: {inbound}")
        agents = Job.objects.filter(tenant=slug, action=AGENT_RUN).order_by("id")
        w("Agent runs: " + "; ".join(f"{j.key} proposed {len((j.result or {}).get('proposed', []))} new"
                                     for j in agents))
        w("\nWaiting for a reviewer")
        for job in Job.objects.filter(tenant=slug, state=State.WAITING_REVIEW).order_by("id"):
            w(f"  {job.key}: {job.wait_reason}")
        for job in Job.objects.filter(tenant=slug, state=State.NEEDS_ATTENTION).order_by("id"):
            w(f"  needs an operator: {job.key}: {job.last_error}")
        total = len(messages)
        per = max((len(v) for v in by_reference.values()), default=0)
        w(f"\nthe provider holds {total} message(s); most for one operation: {per}")
        w("\nadmin users (password " + repr(password) + " for the ones created now): "
          + ", ".join(f"{name} ({state})" for name, state in users.items()))

    @staticmethod
    def _receipt(op: Operation) -> str:
        receipt = getattr(op, "receipt", None)
        if receipt is None:
            return f"none, operation {op.state}"
        return f"{receipt.how} ({receipt.provider_reference})"

    def _reminder_story(self, invoice: Invoice) -> str:
        job = self._job(invoice_reminder_key(invoice.number))
        timers = list(Timer.objects.filter(tenant=invoice.tenant.slug, subject_type="company.invoice",
                                           subject_id=str(invoice.pk)).order_by("id"))
        parts = []
        for timer in timers:
            outcome = timer.outcome or {}
            if timer.state == Timer.Status.CANCELLED:
                parts.append(f"reminder cancelled: {outcome.get('reason', '')}")
            elif timer.state == Timer.Status.SUPERSEDED:
                parts.append("reminder re-planned (the invoice changed)")
            elif timer.state == Timer.Status.PENDING:
                parts.append(f"reminder planned for {timer.scheduled_for:%Y-%m-%d %H:%M} UTC")
        if job is not None:
            result = job.result or {}
            if job.state == State.DONE and result.get("sent"):
                parts.append(f"reminded once (receipt {result.get('receipt')})")
            elif job.state == State.DONE:
                parts.append(f"not reminded: {result.get('reason', '')}")
            else:
                parts.append(f"reminder job {job.state}: {job.wait_reason or job.last_error}")
        return "; ".join(parts) or "nothing planned"

    # ------------------------------------------------------------ processes

    def _start_worker(self, name: str, *, read_timeout: float, concurrency: int = 2) -> subprocess.Popen:
        env = {**self.env, "PROVIDER_READ_TIMEOUT": str(read_timeout), "PROVIDER_CONNECT_TIMEOUT": "1"}
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_worker", "--worker-id", name, "--lease-ttl",
             str(LEASE_TTL), "--poll-interval", "0.1", "--concurrency", str(concurrency)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.children.append(worker)
        return worker

    def _serve(self, port: int) -> None:
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=self.env, cwd=ROOT,
        )
        self.children.append(server)
        self.stdout.write(f"\nAdmin: http://127.0.0.1:{port}/admin/ — demo-worker-2 and the simulator keep "
                          "running behind it, so an approval there really runs. Ctrl-C stops all of them.")
        server.wait()

    def _stop_children(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    # ------------------------------------------------------------ helpers

    def _job(self, key: str) -> Job | None:
        return Job.objects.filter(tenant=self.tenant_slug, key=key).first()

    def _wait(self, predicate, what: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise CommandError(f"gave up after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def _reply(self, number: str, decision: str, event_id: str) -> None:
        response = quote_reply_post(provider=REPLY_PROVIDER, secret=self.secret, tenant=self.tenant_slug,
                                    quote_number=number, decision=decision, event_id=event_id)
        if response.status_code >= 400:
            raise CommandError(f"the reply to {number} was refused: {response.status_code} {response.content!r}")

    def _users(self, password: str) -> dict[str, str]:
        """Contract C4: create the development users only when missing; an
        existing user (and their password) is left exactly as it is."""
        User = get_user_model()
        tenant = tenant_ensure(slug=self.tenant_slug, name=self.tenant_slug.title())
        states = {}
        for username, group_name, role, superuser in DEMO_USERS:
            if User.objects.filter(username=username).exists():
                states[username] = "existed, left unchanged"
                continue
            user = User.objects.create_user(username=username, password=password, is_staff=True,
                                            is_superuser=superuser)
            if group_name:
                user.groups.add(Group.objects.get_or_create(name=group_name)[0])
            if role:
                Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
            states[username] = f"created{f', {role} in {tenant.slug}' if role else ''}"
        return states

