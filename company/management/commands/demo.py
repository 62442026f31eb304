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
6. The proof, from the database and the provider's own listing, and what
   to do next (who logs in, what waits for them, where). Then the admin is
   served with the worker and the simulator still running, so an approval in
   the browser really runs (`DEMO_SERVE=0`: no serving); the demo prints the
   exact command for a second worker beside it. Ctrl-C stops all of them.

7. An outside agent (DESIGN §15): created with `agent_create`, it proposes
   over the HTTP API of a real server (twice: idempotent), a reviewer
   rejects it, and the agent's own endpoint receives the signed callbacks
   `proposal.decided` and `proposal.cancelled` (before the admin is served).

Each line is written as it happens, also into a pipe (`make demo | tee log`).
"""

import io
import hmac
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse
from django.utils import timezone

from company.models import Invoice, Membership, Proposal, Quote
from company.names import (
    AGENT_RUN,
    SEND_INVOICE_REMINDER,
    SEND_QUOTE_FOLLOW_UP,
    agent_run_key,
    invoice_reminder_key,
    quote_send_key,
)
from company.replies import quote_reply_post
from company.services import (
    customer_suppress,
    invoice_change_terms,
    invoice_record_payment,
    tenant_ensure,
    tenant_policy_set,
)
from connectors.base import redact_credentials
from connectors.simulator_process import running_simulator
from durable.net import free_port
from durable.server import server_argv
from durable.numbers import whole_flag
from jobs import access, interventions
from jobs.inbound import signature_for
from jobs.selectors import newest_event
from jobs.models import InboundEvent, Job, Timer
from jobs.outbox import outbox_relay
from jobs.states import State
from jobs.store import Store
from operations.models import Operation
from review.decisions import job_reject

from .seed_demo import invoice_number, quote_number, refuse_in_production, seed

ROOT = Path(settings.BASE_DIR) if hasattr(settings, "BASE_DIR") else Path(__file__).resolve().parents[3]
REPLY_PROVIDER = "mailer"
EMAIL_PROVIDER = "sim-lookup"
DEMO_USERS = [
    # (username, group, membership role, superuser); each gets the address
    # <username>@example.com, so the reviewer's digest and overdue emails
    # have somewhere to go (the provider simulator's record shows them).
    ("admin", None, None, True),
    ("reviewer", "reviewers", Membership.Role.REVIEWER, False),
    ("operator", "operators", Membership.Role.OPERATOR, False),
    ("staff", "viewers", Membership.Role.VIEWER, False),
]
LEASE_TTL = 2.0
# The worker behind the served admin, and any the user adds beside it:
# answers from the stalling simulator are given up on after this long.
READ_TIMEOUT = 0.5
# The agent whose key the demo leaves for the user (printed last, and in a file).
DEMO_AGENT = "demo-agent"


class _CallbackReceiver:
    """The outside agent's own endpoint: checks each callback's signature with
    the secret agent_create printed, and keeps what it received."""

    def __init__(self):
        self.events, self.secret = [], ""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                expected = signature_for(secret=receiver.secret, timestamp=self.headers.get("X-Signature-Timestamp", ""),
                                         body=body)
                event = json.loads(body)
                if event["id"] not in {e["id"] for e in receiver.events}:  # deduplicate by event id
                    receiver.events.append({**event, "keyed": self.headers.get("Idempotency-Key") == event["id"],
                                            "verified": hmac.compare_digest(expected, self.headers.get("X-Signature",
                                                                                                        ""))})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/callbacks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _http_json(method: str, url: str, key: str, body: dict | None = None) -> tuple[int, dict]:
    """What an outside agent does: JSON over HTTP with its bearer key."""
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = (
        "Tell the company loop end to end on the configured database: seed a tenant, send quote emails through "
        "a provider simulator that loses answers, SIGKILL a worker right after the provider accepted an email, "
        "resume with a new worker, let a reply and a follow-up timer arrive, remind invoices, run the rules "
        "agent, install the calendar's schedules, print the proof and what to do next (who approves what, at "
        "which URL), then serve the console on 127.0.0.1:8000 with a worker and the simulator behind it until "
        "Ctrl-C, printing the command for a second worker (DEMO_SERVE=0 skips serving). Development only: "
        "creates users admin, reviewer, "
        "operator, staff (password DEMO_PASSWORD, default demo-password) when they do not exist; refuses to "
        "run with DURABLE_PRODUCTION=1."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo", help="Tenant slug (default: demo).")
        parser.add_argument("--port", type=whole_flag(1, 65535), default=8000,
                            help="Port the admin is served on (default: 8000).")

    def handle(self, *args, **opts):
        refuse_in_production("the demo creates users with known passwords")
        if isinstance(sys.stdout, io.TextIOWrapper):
            # Into a pipe (`make demo | tee log`) Python buffers whole blocks:
            # the story must appear as it happens, not at Ctrl-C.
            sys.stdout.reconfigure(line_buffering=True)
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
            state_dir = self.state_dir = Path(os.environ.get("DEMO_STATE_DIR") or ROOT / "var")
            provider_db = state_dir / f"demo-provider-{self.tenant_slug}.sqlite3"
            provider_db.parent.mkdir(parents=True, exist_ok=True)
            if not Quote.objects.filter(tenant__slug=self.tenant_slug).exists():
                for stale in provider_db.parent.glob(provider_db.name + "*"):
                    stale.unlink()
            with running_simulator(mode="lookup", db_path=provider_db, stall_after_accept=10,
                                   stall_probability=1.0, quiet=True) as simulator:
                # What every worker of the demo needs to reach its provider
                # (the simulator, on a port of its own) — also a worker the
                # user starts beside it (`_worker_command`).
                self.worker_env = {"PROVIDER_URL": simulator.url, "OPERATIONS_DEFAULT_EMAIL_PROVIDER": EMAIL_PROVIDER}
                self.env = {
                    **os.environ, "PYTHONUNBUFFERED": "1", **self.worker_env,
                    "INBOUND_WEBHOOK_SECRETS": f"{REPLY_PROVIDER}={self.secret}",
                    "INBOUND_PROVIDER_TENANTS": f"{REPLY_PROVIDER}={self.tenant_slug}",
                    # The outside agent's callback receiver listens on 127.0.0.1 (development only).
                    "GATEWAY_CALLBACK_ALLOW_PRIVATE": "1", "GATEWAY_CALLBACK_REQUIRE_HTTPS": "0",
                }
                users = self._story(simulator, opts, password)
                self.stdout.write(f"\nthe story took {time.monotonic() - started:.0f}s")
                serving = os.environ.get("DEMO_SERVE", "1") != "0"
                self._next_steps(users, password, port=opts["port"], serving=serving)
                if serving:
                    self._serve(opts["port"])
        except KeyboardInterrupt:
            self.stdout.write("\nstopping the worker, the simulator and the server")
        finally:
            self._stop_children()

    # ------------------------------------------------------------ the story

    def _story(self, simulator, opts, password: str) -> dict[str, str]:
        """Tell the story (or, on a database that told it before, its
        proof); returns what became of each demo user."""
        w = self.stdout.write
        slug = self.tenant_slug
        users = self._users(password)
        result = seed(tenant_slug=slug, quotes=3, invoices=5)
        tenant = result["tenant"]
        w(f"1. seeded tenant {slug!r}: approved {result['quotes_approved']} quote(s), issued "
          f"{result['invoices_issued']} invoice(s) through the services (each change with its outbox event)")
        self._install_schedules()
        if not result["quotes_approved"]:
            w("   nothing new: this database has told the story before; the proof below is read from it and "
              "from the provider's storage")
            self._start_worker("demo-worker-2", read_timeout=READ_TIMEOUT)
            self._report(simulator, users, password)
            return users
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
        second = self._start_worker("demo-worker-2", read_timeout=READ_TIMEOUT)
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
        self._outside_agent_story()
        return users

    def _install_schedules(self) -> None:
        """The calendar's schedules (DESIGN §13), idempotently: a repeated
        run finds them installed and leaves them as they are."""
        out = io.StringIO()
        call_command("install_schedules", stdout=out)
        outcomes = [line.partition(": ") for line in out.getvalue().splitlines() if line.strip()]
        created = [name for name, _, outcome in outcomes if outcome == "created"]
        kept = [name for name, _, outcome in outcomes if outcome != "created"]
        said = "; ".join(filter(None, [f"created {', '.join(created)}" if created else "",
                                       f"already installed: {', '.join(kept)}" if kept else ""]))
        self.stdout.write(f"   calendar (django-q2, `install_schedules`): {said} — `make calendar` runs them")

    # ------------------------------------------------------------ the outside agent (DESIGN §15)

    def _outside_agent_story(self) -> None:
        """An agent outside the process: created with `agent_create` (its key
        and callback secret printed once), it proposes over the HTTP API of a
        real server, a reviewer decides in the console's service, and the
        agent's own endpoint receives the signed callbacks. The proposal is
        rejected, so no email leaves and the provider's count above stays true."""
        w = self.stdout.write
        slug = self.tenant_slug
        settings.GATEWAY_CALLBACK_ALLOW_PRIVATE, settings.GATEWAY_CALLBACK_REQUIRE_HTTPS = True, False
        receiver = _CallbackReceiver()
        created = StringIO()
        try:
            call_command("agent_create", tenant=slug, name="outside-agent", callback_url=receiver.url,
                         actions="connectors.send_email", stdout=created)
        except CommandError as exc:
            w(f"\nOutside agent: not created ({exc})")
            receiver.stop()
            return
        lines = created.getvalue().splitlines()
        key = lines[-1]
        receiver.secret = next(line.split(": ", 1)[1] for line in lines if line.startswith("callback secret: "))
        prefix = key.split("_")[1]
        w(f"\nOutside agent: manage.py agent_create made agent outside-agent of {slug} with key {prefix} (printed "
          f"once, last line) and callbacks to {receiver.url}")
        port = free_port()
        server = subprocess.Popen(server_argv(port=port), env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        self.children.append(server)
        api = f"http://127.0.0.1:{port}/api/v1"
        self._wait(lambda: _answers(f"{api}/openapi.json"), "the API server", timeout=60)
        proposal = {"action": "connectors.send_email", "key": "outside-agent-hello-1",
                    "rationale": "the customer asked for a summary of their quotes",
                    "payload": {"to": "grace@example.com", "subject": "Your quotes", "body": "Here they are."}}
        status, body = _http_json("POST", f"{api}/proposals", key, proposal)
        w(f"  POST {api}/proposals → {status}: {body.get('key')} is {body.get('state')} "
          f"(the tenant's policy sends it to a reviewer: needs_review={body.get('needs_review')})")
        status, again = _http_json("POST", f"{api}/proposals", key, proposal)
        w(f"  the same POST again → {status}, created: {again.get('created')} (idempotent by business key)")
        job = self._job(proposal["key"])
        note = "we send summaries by post this month"
        # The reviewer's decision, through the console's own service (permission, role, history, LogEntry).
        deciders = [u for u in get_user_model().objects.filter(username__in=["reviewer", "admin"]).order_by("-username")
                    if access.may(u, "reject", job)]
        if deciders:
            job_reject(job_id=job.pk, user=deciders[0], note=note, seen_event=newest_event(job.pk).id)
            w(f"  {deciders[0].username} rejected it in the console's decision service: \"{note}\"")
        else:
            interventions.job_reject(tenant=slug, key=job.key, reason=note, actor="demo reviewer")
            w(f"  rejected (no demo user may decide here): \"{note}\"")
        self._wait(lambda: len(receiver.events) >= 2, "the outside agent's callbacks", timeout=60)
        for event in receiver.events:
            w(f"  the agent's endpoint received {event['type']} (event {event['id'][:8]}…, signature "
              f"{'verified' if event['verified'] else 'WRONG'}, Idempotency-Key = event id: {event['keyed']})")
        status, read = _http_json("GET", f"{api}/proposals/{proposal['key']}", key)
        decision = read.get("decision") or {}
        w(f"  GET {api}/proposals/{proposal['key']} → {status}: {read.get('state')}, decision "
          f"{decision.get('decision')} by {decision.get('by')}")
        server.terminate()
        receiver.stop()

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
        op = Operation.objects.select_related("job").filter(intent_key=message["client_reference"]).first()
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
            emails = sum(len(by_reference.get(op.intent_key, [])) for op in ops if op.step == "send")
            receipts = ", ".join(self._receipt(op) for op in ops if op.step == "send") or "no operation"
            w(f"  {quote.number} to {quote.customer.email}: {quote.status}; emails at the provider: {emails}; "
              f"receipt: {receipts}; job {job.key if job else '-'} {job.state if job else ''}")
            if job is not None and job.events.filter(kind__in=["recover", "takeover"]).exists():
                workers = ", ".join(sorted(set(job.events.exclude(claimed_at=None).values_list("worker_id", flat=True))))
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

    def _next_steps(self, users: dict, password: str, *, port: int, serving: bool) -> None:
        """What a person does next: who logs in with which password, and
        which item waits for them at which URL."""
        w = self.stdout.write
        base = f"http://127.0.0.1:{port}"
        w("\nWhat to do next")
        step = 1
        if not serving:
            w(f"  {step}. serve the admin: run the demo again without DEMO_SERVE=0 (a repeated run tells the same "
              f"story from the records and serves it on {base}/)")
            step += 1

        def login(username: str) -> str:
            if users.get(username, "").startswith("created"):
                return f"log in at {base}/admin/ as {username!r} with the password {password!r}"
            return f"log in at {base}/admin/ as {username!r} (an existing user the demo left unchanged: your password)"

        reviews = list(Job.objects.filter(tenant=self.tenant_slug, state=State.WAITING_REVIEW).order_by("id"))
        if reviews:
            w(f"  {step}. {login('reviewer')}, then decide what waits for review "
              f"({base}{reverse('console:review')}):")
            for job in reviews:
                w(f"     - approve {job.key} at {base}{reverse('console:decide', args=[job.pk])} — "
                  f"{self._what_approval_does(job)}")
            step += 1
        attention = list(Job.objects.filter(tenant=self.tenant_slug, state=State.NEEDS_ATTENTION).order_by("id"))
        if attention:
            w(f"  {step}. {login('operator')}, then resolve what needs attention "
              f"({base}{reverse('console:attention')}):")
            for job in attention:
                w(f"     - {job.key} at {base}{reverse('console:decide', args=[job.pk])}")
            step += 1
        if serving:
            env, argv = self._worker_command("demo-worker-3", read_timeout=READ_TIMEOUT)
            # The same database; a password in its URL is not printed.
            database = os.environ.get("DATABASE_URL")
            secret = bool(database) and urlsplit(database).password is not None
            if database:
                env = {"DATABASE_URL": redact_credentials(database) if secret else database, **env}
            command = " ".join([*(f"{name}={shlex.quote(value)}" for name, value in env.items()), shlex.join(argv)])
            w(f"  {step}. to add a worker beside the demo's, run in a second terminal (same database, same "
              f"provider simulator and provider as the demo's workers):")
            w(f"     {command}")
            if secret:
                w("     (put your database user and password back in place of ***)")
            step += 1
        self._agent_key(base, step)

    def _agent_key(self, base: str, step: int) -> None:
        """A fresh key of the demo's agent, for the user's own requests:
        printed alone on the last line, and written to a file it names."""
        w = self.stdout.write
        printed = StringIO()
        try:
            call_command("agent_create", tenant=self.tenant_slug, name=DEMO_AGENT, actions="connectors.send_email",
                         stdout=printed)
        except CommandError:  # made by an earlier run: a new key of it
            call_command("agent_key", tenant=self.tenant_slug, name=DEMO_AGENT, new=True, stdout=printed)
        key = printed.getvalue().splitlines()[-1]
        path = self.state_dir / "demo-agent-key"
        path.write_text(key + "\n")
        path.chmod(0o600)
        w(f"  {step}. propose as an agent over the API (agent {DEMO_AGENT} of {self.tenant_slug}, may propose "
          f"connectors.send_email; its key is the last line below and is in {path}):")
        w(f"     curl -s {base}/api/v1/proposals -H \"Authorization: Bearer $(cat {path})\" "
          f"-H 'Content-Type: application/json' -d '{{\"action\": \"connectors.send_email\", \"key\": "
          f"\"welcome-ada-1\", \"rationale\": \"Ada signed up\", \"payload\": {{\"to\": \"ada@example.com\", "
          f"\"subject\": \"Welcome\", \"body\": \"Hello Ada!\"}}}}'")
        w(key)

    def _what_approval_does(self, job: Job) -> str:
        if job.action == SEND_INVOICE_REMINDER:
            return "the reminder goes out once, through the provider"
        if job.action == SEND_QUOTE_FOLLOW_UP:
            return "the follow-up email goes out once, through the provider"
        return f"the {job.action} job runs"

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
        planned = [t for t in timers if t.state == Timer.Status.PENDING]
        # The rules agent proposed this reminder before its timer came due:
        # the job (the same business key the timer would use) waits for a
        # reviewer, and the timer, when due, finds it there and adds nothing.
        proposed_early = None
        if job is not None and job.state == State.WAITING_REVIEW and planned:
            proposed_early = Proposal.objects.filter(tenant=invoice.tenant, job_key=job.key).first()
        parts = []
        for timer in timers:
            outcome = timer.outcome or {}
            if timer.state == Timer.Status.CANCELLED:
                parts.append(f"reminder cancelled: {outcome.get('reason', '')}")
            elif timer.state == Timer.Status.SUPERSEDED:
                parts.append("reminder re-planned (the invoice changed)")
            elif timer.state == Timer.Status.PENDING and not proposed_early:
                parts.append(f"reminder planned for {timer.scheduled_for:%Y-%m-%d %H:%M} UTC")
        if proposed_early:
            parts.append(
                f"its reminder was planned for {planned[0].scheduled_for:%Y-%m-%d %H:%M} UTC, but "
                f"{proposed_early.proposed_by} proposed reminding it now ({proposed_early.rationale}) and the "
                f"tenant's policy has a reviewer approve such proposals: the reminder job waits for a reviewer "
                f"(WAITING_REVIEW) — approved, one reminder goes out at once; until then none is sent, not even "
                f"when the planned time comes")
        elif job is not None:
            result = job.result or {}
            if job.state == State.DONE and result.get("sent"):
                parts.append(f"reminded once (receipt {result.get('receipt')})")
            elif job.state == State.DONE:
                parts.append(f"not reminded: {result.get('reason', '')}")
            elif job.state == State.WAITING_REVIEW:
                parts.append(f"the reminder job waits for a reviewer (WAITING_REVIEW): {job.wait_reason}")
            else:
                parts.append(f"reminder job {job.state}: {job.wait_reason or job.last_error}")
        return "; ".join(parts) or "nothing planned"

    # ------------------------------------------------------------ processes

    def _worker_command(self, name: str, *, read_timeout: float, concurrency: int = 2) -> tuple[dict, list]:
        """The environment (beyond the caller's) and the command line of a
        worker of this demo: its provider, its simulator's URL, its timeouts."""
        env = {**self.worker_env, "PROVIDER_READ_TIMEOUT": str(read_timeout), "PROVIDER_CONNECT_TIMEOUT": "1"}
        argv = [sys.executable, str(ROOT / "manage.py"), "run_worker", "--worker-id", name, "--lease-ttl",
                str(LEASE_TTL), "--poll-interval", "0.1", "--concurrency", str(concurrency)]
        return env, argv

    def _start_worker(self, name: str, *, read_timeout: float, concurrency: int = 2) -> subprocess.Popen:
        env, argv = self._worker_command(name, read_timeout=read_timeout, concurrency=concurrency)
        worker = subprocess.Popen(argv, env={**self.env, **env}, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        self.children.append(worker)
        return worker

    def _serve(self, port: int) -> None:
        # The production server (durable.server): the console, the API and /mcp.
        server = subprocess.Popen(server_argv(port=port), env=self.env, cwd=ROOT)
        self.children.append(server)
        self.stdout.write(f"\nAdmin: http://127.0.0.1:{port}/admin/ (the agent API at /api/v1/, MCP at /mcp) — "
                          "demo-worker-2 and the simulator keep "
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
        return Job.objects.by_key(self.tenant_slug, key).first()

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
            user = User.objects.create_user(username=username, email=f"{username}@example.com", password=password,
                                            is_staff=True, is_superuser=superuser)
            if group_name:
                user.groups.add(Group.objects.get_or_create(name=group_name)[0])
            if role:
                Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
            states[username] = f"created{f', {role} in {tenant.slug}' if role else ''}"
        return states

