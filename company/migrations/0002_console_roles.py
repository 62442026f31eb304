"""The console's groups and their permissions (DESIGN §14), created here so
every installation has them — never by the demo.

- viewers: read jobs, their history, timers, outbox and inbound events,
  operations, receipts and connector pauses; decide nothing.
- reviewers: what viewers read, plus `jobs.review_job` (approve, correct,
  reject WAITING_REVIEW items) — nothing else.
- operators: what viewers read, plus `jobs.operate_job` (retry, resolve with
  evidence, cancel NEEDS_ATTENTION items, requeue outbox events, resolve
  inbound events) and `operations.decide_operation` (operations in doubt,
  connector pauses).

A decision also needs a `Membership` with the matching role in the job's
tenant (`jobs.access`). Permissions are created here when missing: on a fresh
database they do not exist yet while migrations run (Django creates them
after the last migration), and the later creation skips existing ones.
"""

from django.db import migrations

READ = {
    "jobs": ["job", "jobevent", "timer", "outboxevent", "inboundevent"],
    "operations": ["operation", "operationevent", "receipt", "connectorpause"],
    "company": ["tenant"],
}
CUSTOM = {
    ("jobs", "job", "review_job"): "Can decide jobs waiting for review (approve, correct, reject)",
    ("jobs", "job", "operate_job"): "Can decide jobs that need attention (retry, resolve, cancel) and requeue events",
    ("operations", "operation", "decide_operation"): "Can decide operations in doubt and clear connector pauses",
}
GROUPS = {
    "viewers": [],
    "reviewers": [("jobs", "job", "review_job")],
    "operators": [("jobs", "job", "operate_job"), ("operations", "operation", "decide_operation")],
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")

    def permission(app_label, model, codename, name):
        content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
        perm, _ = Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": name[:255]})
        return perm

    read = [permission(app, model, f"view_{model}", f"Can view {apps.get_model(app, model)._meta.verbose_name}")
            for app, models in READ.items() for model in models]
    for name, extra in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*read, *(permission(app, model, code, CUSTOM[(app, model, code)])
                                       for app, model, code in extra))


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=list(GROUPS)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("company", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0004_console_permissions_key_search"),
        ("operations", "0002_decide_permission"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
