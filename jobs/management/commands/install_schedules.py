from django.core.management.base import BaseCommand

from jobs.schedules import schedules_install


class Command(BaseCommand):
    help = (
        "Create the default django-q2 schedules (settings.DURABLE_SCHEDULES: invoice reminder planning, "
        "retention sweep, consistency audit) that do not exist yet. Idempotent: a schedule that exists under "
        "its name is left as it is. `manage.py qcluster` runs them."
    )

    def handle(self, *args, **opts):
        for name, outcome in schedules_install():
            self.stdout.write(f"{name}: {outcome}")
