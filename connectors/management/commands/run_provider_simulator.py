"""``manage.py run_provider_simulator``: the provider simulator (DESIGN §10).

A thin shell over ``connectors.simulator``, which also runs without Django as
``python -m connectors.simulator`` with the same options.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connectors import simulator


class Command(BaseCommand):
    help = (
        "Run the HTTP email provider simulator - the outside world - with its own SQLite "
        "storage. Prints 'provider-simulator listening on URL mode=MODE db=PATH' once "
        "ready; stops cleanly on SIGTERM/SIGINT."
    )
    # The simulator uses neither Django's database nor its apps.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        simulator.add_arguments(parser)

    def handle(self, *args, **options):
        try:
            config = simulator.config_from_options(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        simulator.serve(config, out=self.stdout)
