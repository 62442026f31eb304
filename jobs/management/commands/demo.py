import os

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db.models import Count

from jobs.models import Job
from jobs.store import JobSpec, Store
from jobs.worker import Worker, WorkerConfig

DEMO_USERS = [
    # (username, groups, superuser) — development passwords, printed below.
    ("admin", [], True),
    ("operator", ["operators"], False),
    ("reviewer", ["reviewers"], False),
    ("staff", ["staff"], False),
]


class Command(BaseCommand):
    help = (
        "The end-to-end story on the configured database: demo users, a batch of jobs, a worker run "
        "until idle, and a summary of what happened. Development only: it creates users with known "
        "passwords."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=20, help="How many jobs.noop jobs to enqueue.")

    def handle(self, *args, **opts):
        password = os.environ.get("DEMO_PASSWORD", "demo-password")
        self._users(password)
        store = Store()
        created = store.enqueue_many(JobSpec("demo", f"noop-{i:03d}") for i in range(opts["jobs"]))
        store.enqueue("demo", "mystery-action", action="demo.not_registered")
        self.stdout.write(f"enqueued {created} new jobs.noop jobs and one job with an unregistered action")
        Worker(WorkerConfig(worker_id="demo-worker", concurrency=4, until_idle=True, poll_interval=0.2)).run()
        self.stdout.write("\njobs by state:")
        for row in Job.objects.values("tenant", "state").annotate(n=Count("id")).order_by("tenant", "state"):
            self.stdout.write(f"  {row['tenant']:<10} {row['state']:<18} {row['n']}")
        attention = Job.objects.filter(state="NEEDS_ATTENTION").first()
        if attention:
            self.stdout.write(f"\nneeds attention: {attention.tenant}/{attention.key}: {attention.last_error}")
        self.stdout.write(f"\ndemo users (password {password!r}): " + ", ".join(u for u, _, _ in DEMO_USERS))

    def _users(self, password):
        User = get_user_model()
        job_perms = Permission.objects.filter(content_type__app_label="jobs")
        for group_name in ("operators", "reviewers", "staff"):
            group, _ = Group.objects.get_or_create(name=group_name)
            perms = job_perms if group_name in ("operators", "reviewers") else job_perms.filter(codename__startswith="view")
            group.permissions.set(perms)
        for username, groups, superuser in DEMO_USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.is_staff = True
            user.is_superuser = superuser
            user.set_password(password)
            user.save()
            user.groups.set(Group.objects.filter(name__in=groups))
