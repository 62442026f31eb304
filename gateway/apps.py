from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The agent gateway (DESIGN §15): outside agents propose work over HTTP
    (`/api/v1/`) and MCP, learn its outcome by signed callbacks, and stay
    within their limits. Above `company`; nothing depends on it."""

    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Operators of a tenant manage its agents (DESIGN §14): create, issue
        # and revoke keys, pause and resume — a tenant-level decision with
        # this app's own permission.
        from jobs.access import OPERATOR, Decision, register_decision

        register_decision(Decision("manage_agent", "Manage agents", "gateway.manage_agent", frozenset({OPERATOR}),
                                   frozenset()))

        # A paused agent's jobs are held where operations dispatch.
        from operations.limits import register_dispatch_guard

        from .services import agent_hold

        register_dispatch_guard(agent_hold)

        # Callbacks about a proposal appear in its job's evidence timeline.
        from review.admin import register_timeline_source

        from .callbacks import timeline_items

        register_timeline_source(timeline_items)
