"""`manage.py bench_gateway`: the agent gateway's figures (see proving/bench/gateway.py)."""

import uuid

from django.core.management.base import BaseCommand

from proving.bench import gateway as bench_gateway


NAMES = {"asgi": "the production server (uvicorn, durable.asgi) on 127.0.0.1",
         "runserver": "runserver on 127.0.0.1"}


class Command(BaseCommand):
    help = ("Proposal API latency (p50/p99) and requests/s with concurrent clients against real servers "
            "started on 127.0.0.1 (--server: the production ASGI server, runserver; in turns) or one running "
            "on this database (--url), beside a minimal django-ninja POST inserting one row on the same server, "
            "and the cost of the limit checks with --operations operations in the "
            "table (EXPLAIN and mean time). Touches only tenant bench-gateway and removes its rows after.")

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=8, help="Concurrent clients (default 8).")
        parser.add_argument("--requests", type=int, default=100, help="Requests per client and kind (default 100).")
        parser.add_argument("--operations", type=int, default=1_000_000,
                            help="Operations loaded for the limit check (default 1,000,000).")
        parser.add_argument("--repeat", type=int, default=200, help="Calls per limit check timing (default 200).")
        parser.add_argument("--server", action="append", choices=bench_gateway.SERVERS,
                            help="Server to start and measure, repeatable, in turns (default: asgi, the production "
                                 "server of durable.server).")
        parser.add_argument("--url", default="",
                            help="Measure the server running at this URL instead (it must use this database and "
                                 "serve DJANGO_SETTINGS_MODULE=durable.settings_bench), e.g. http://127.0.0.1:8000.")
        parser.add_argument("--turns", type=int, default=3,
                            help="Alternating rounds of proposal POSTs and reference POSTs (default 3).")
        parser.add_argument("--skip-limits", action="store_true", help="Only the API figures.")
        parser.add_argument("--quick", action="store_true", help="Small sizes: 4 clients × 25, 100,000 operations.")

    def handle(self, *args, **options):
        if options["quick"]:
            options.update(clients=4, requests=25, operations=100_000, repeat=50)
        say = lambda text: self.stderr.write(text)  # noqa: E731 - progress on stderr, figures on stdout
        bench_gateway.cleanup()
        try:
            database = "PostgreSQL" if bench_gateway.connection.vendor == "postgresql" else "SQLite"
            targets = [options["url"]] if options["url"] else options["server"] or ["asgi"]
            lines = []
            for target in targets:
                named = f"the server at {target}" if options["url"] else NAMES[target]
                say(f"API on {named}: {options['clients']} clients × {options['requests']} requests …")
                figures = bench_gateway.api_figures(clients=options["clients"], requests=options["requests"],
                                                    run=uuid.uuid4().hex[:6], server=target, url=options["url"],
                                                    turns=options["turns"])
                lines += [f"Agent gateway — proposal API against {named} ({database}), one agent per client:",
                          *bench_gateway.render_api(figures), bench_gateway.cost_ratio(figures), ""]
            if not options["skip_limits"]:
                lines += bench_gateway.limit_figures(operations=options["operations"], repeat=options["repeat"],
                                                     progress=say)
            self.stdout.write("\n".join(lines))
        finally:
            bench_gateway.cleanup()
