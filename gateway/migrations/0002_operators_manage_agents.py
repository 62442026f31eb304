"""Operators manage their tenants' agents (`gateway.manage_agent`: create,
issue and revoke keys, pause and resume); every console group may read
agents and keys (a key is shown by its prefix only). Permissions are created
when missing, as in company's 0002."""

from django.db import migrations

READ = ["agent", "apikey", "agentproposal", "callbackevent"]


def grant(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")

    def permission(model, codename, name):
        content_type, _ = ContentType.objects.get_or_create(app_label="gateway", model=model)
        perm, _ = Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": name})
        return perm

    read = [permission(model, f"view_{model}", f"Can view {model}") for model in READ]
    manage = permission("agent", "manage_agent", "Can create agents, issue and revoke their keys, pause and resume them")
    for name in ("viewers", "reviewers", "operators"):
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(*read, *([manage] if name == "operators" else []))


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0001_initial"),
        ("company", "0002_console_roles"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
