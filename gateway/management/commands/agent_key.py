"""`manage.py agent_key --tenant T --name N (--new | --revoke PREFIX)` (DESIGN §15)."""

from django.core.management.base import BaseCommand, CommandError

from gateway.models import Agent
from gateway.services import AgentError, agent_key_issue, agent_key_revoke


class Command(BaseCommand):
    help = ("Issue a new API key for an agent (--new: printed alone on the last line, once) or revoke one by "
            "its prefix (--revoke PREFIX: from then on it answers 401).")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--name", required=True, help="The agent's name.")
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--new", action="store_true", help="Issue a new key.")
        group.add_argument("--revoke", metavar="PREFIX", help="Revoke the key with this prefix.")

    def handle(self, *args, **options):
        agent = Agent.objects.select_related("tenant").filter(tenant__slug=options["tenant"],
                                                              name=options["name"]).first()
        if agent is None:
            raise CommandError(f"tenant {options['tenant']!r} has no agent named {options['name']!r}")
        if options["new"]:
            issued = agent_key_issue(agent=agent, actor="manage.py agent_key")
            self.stdout.write(f"API key (prefix {issued.prefix}; shown once, keep it now):")
            self.stdout.write(issued.key)
            return
        try:
            key = agent_key_revoke(agent=agent, prefix=options["revoke"], actor="manage.py agent_key")
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"key {key.prefix} of agent {agent.name} revoked at {key.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
