"""`manage.py agent_create --tenant T --name N [--actions A,B] [--callback-url URL]` (DESIGN §15)."""

from django.core.management.base import BaseCommand, CommandError

from company.models import Tenant
from gateway.services import AgentError, agent_create


class Command(BaseCommand):
    help = ("Create an outside agent of an existing tenant and its first API key. The key is printed alone on "
            "the last line, once: it is stored only as a hash. Without --actions the agent may propose every "
            "registered action that declares a payload schema.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="The tenant's slug (it must exist).")
        parser.add_argument("--name", required=True, help="The agent's name, unique in the tenant.")
        parser.add_argument("--actions", default=None, help="Comma-separated actions it may propose.")
        parser.add_argument("--callback-url", default="", help="Where its outcome events are POSTed, signed.")
        parser.add_argument("--proposals-per-minute", type=int, default=None,
                            help="Its own limit (default: GATEWAY_PROPOSALS_PER_MINUTE).")
        parser.add_argument("--proposals-per-day", type=int, default=None,
                            help="Its own limit per rolling 24 h (default: GATEWAY_PROPOSALS_PER_DAY).")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}; create it first (e.g. manage.py seed_demo)")
        actions = None if options["actions"] is None else options["actions"].split(",")
        try:
            agent, issued = agent_create(tenant=tenant, name=options["name"], actions=actions,
                                         callback_url=options["callback_url"], actor="manage.py agent_create",
                                         proposals_per_minute=options["proposals_per_minute"],
                                         proposals_per_day=options["proposals_per_day"])
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"agent {agent.name} of tenant {tenant.slug} (id {agent.pk})")
        self.stdout.write(f"may propose: {', '.join(agent.actions) if agent.actions is not None else 'every action with a payload schema'}")
        if agent.callback_url:
            self.stdout.write(f"callbacks to {agent.callback_url}, signed with this secret (shown once):")
            self.stdout.write(f"callback secret: {agent.callback_secret}")
        self.stdout.write(f"API key (prefix {issued.prefix}; shown once, keep it now):")
        self.stdout.write(issued.key)
