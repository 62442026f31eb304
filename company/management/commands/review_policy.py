"""`manage.py review_policy --tenant T [--action A] …`: set how a tenant's
reviews are held to time and to four eyes, and how often its
reviewers get the digest of what waits. Periods are Django durations:
`HH:MM:SS`, `D HH:MM:SS` or ISO 8601 (`P1D`, `PT4H`)."""

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_duration

from company.models import Tenant
from company.review_policy import review_policy_set
from company.services import tenant_policy_set


def _period(text: str | None, flag: str):
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    period = parse_duration(text.strip())
    if period is None:
        raise CommandError(f"{flag}: {text!r} is not a period (use HH:MM:SS, 'D HH:MM:SS' or ISO 8601 like PT4H)")
    return period


class Command(BaseCommand):
    help = ("Set a tenant's review policy for one action (or its default, without --action): approvals by "
            "different people, the due time, the rejection after overdue, whether a correction restarts the "
            "clock; and with --digest-every the period of the reviewers' digest email (off: none).")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="The tenant's slug (it must exist).")
        parser.add_argument("--action", default="", help="The action it applies to (default: every action "
                                                         "without its own policy).")
        parser.add_argument("--approvals", type=int, choices=[1, 2], default=1,
                            help="Approvals by different people (2: four eyes). Default 1.")
        parser.add_argument("--due-after", help="From entering review to overdue (default: never due).")
        parser.add_argument("--reject-after", help="From overdue to a rejection by the policy (default: never).")
        parser.add_argument("--reset-on-correction", action="store_true",
                            help="A correction awaiting its second approval restarts the clock.")
        parser.add_argument("--digest-every", help="The reviewers' digest period (e.g. 1 00:00:00; off: none); "
                                                   "unchanged when absent.")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        try:
            policy = review_policy_set(
                tenant=tenant, action=options["action"], approvals=options["approvals"],
                due_after=_period(options["due_after"], "--due-after"),
                reject_after=_period(options["reject_after"], "--reject-after"),
                reset_due_on_correction=options["reset_on_correction"])
            if options["digest_every"] is not None:
                tenant_policy_set(tenant=tenant, review_digest_every=_period(options["digest_every"],
                                                                             "--digest-every"))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{policy}: {policy.approvals} approval(s), due after {policy.due_after or 'never'}, "
                          f"rejected {policy.reject_after or 'never'} after overdue"
                          f"{', clock restarts on correction' if policy.reset_due_on_correction else ''}")
