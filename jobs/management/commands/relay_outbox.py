import signal
import threading

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from durable.numbers import number_flag, whole_flag
from jobs import notify, pooling
from jobs.outbox import outbox_relay


class Command(BaseCommand):
    help = (
        "Deliver pending outbox events to their consumers, in order per aggregate, retrying failures with "
        "backoff and quarantining poison events. run_worker already does this; use this command to run the "
        "relay alone. With --once: one bounded pass, then exit 0."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="One pass of at most --limit events, then exit.")
        parser.add_argument("--limit", type=whole_flag(1, 100_000), default=100,
                            help="Events handled per pass (1-100000). Default 100.")
        parser.add_argument("--poll-interval", type=number_flag(minimum=0.01, maximum=3600), default=2.0,
                            help="Longest sleep between passes when no notification arrives, in seconds "
                                 "(0.01-3600). Default 2.")
        parser.add_argument("--relay-id", default="relay", help="Name used in log lines.")

    def handle(self, *args, **opts):
        if connection.vendor == "postgresql" and notify.pool_mode() == "direct":
            # As run_worker: the default configuration behind a
            # transaction-mode pooler is refused, naming the setting.
            if reason := pooling.transaction_pooler_seen():
                raise CommandError(reason)
        if opts["once"]:
            handled = outbox_relay(limit=opts["limit"], worker_id=opts["relay_id"])
            self.stdout.write(f"handled {handled} outbox event(s)")
            return
        stop, wake = threading.Event(), notify.Wakeup()

        def on_signal(signum, frame):
            stop.set()
            wake.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # The LISTEN on this thread's own connection (or DATABASE_LISTEN_URL
        # behind a transaction-mode pooler), waited for with the poll.
        listener = notify.listener(wake.set)
        if listener is None and notify.polling_only_reason() and connection.vendor == "postgresql":
            self.stderr.write(f"wake-ups fall back to polling: {notify.polling_only_reason()}")
        total = 0
        try:
            while not stop.is_set():
                wake.clear()
                close_old_connections()
                handled = outbox_relay(limit=opts["limit"], worker_id=opts["relay_id"])
                total += handled
                if listener:
                    listener.ensure()
                if handled < opts["limit"]:
                    # Caught up: sleep until an emit's NOTIFY (on commit) or the poll.
                    wake.wait(opts["poll_interval"], listener)
        finally:
            if listener:
                listener.close()
        self.stdout.write(f"handled {total} outbox event(s)")
