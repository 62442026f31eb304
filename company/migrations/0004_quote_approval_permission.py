"""Approving a quote is a decision with its own permission (DESIGN §14):
`company.approve_quote`, granted to `reviewers`; a reviewer also needs a
reviewer's membership in the quote's tenant (`jobs.access`, decision
`approve_quote`). Every group reads the business records of its tenants
(customers, quotes, invoices, proposals, tenant policies); none may change
them in the admin — changes go through the services.

Permissions are created here when missing (as in 0002_console_roles): on a
fresh database Django creates them only after the last migration."""

from django.db import migrations

READ = ["customer", "quote", "invoice", "proposal", "tenantpolicy"]
APPROVE = ("approve_quote", "Can approve quotes (their emails are then sent)")
GROUPS = {"viewers": [], "reviewers": [APPROVE], "operators": []}


def grant(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")

    def permission(model, codename, name):
        content_type, _ = ContentType.objects.get_or_create(app_label="company", model=model)
        perm, _ = Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": name[:255]})
        return perm

    read = [permission(model, f"view_{model}", f"Can view {apps.get_model('company', model)._meta.verbose_name}")
            for model in READ]
    for name, extra in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*read, *(permission("quote", codename, label) for codename, label in extra))


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    perms = Permission.objects.filter(content_type__app_label="company",
                                      codename__in=[f"view_{model}" for model in READ] + [APPROVE[0]])
    for group in Group.objects.filter(name__in=list(GROUPS)):
        group.permissions.remove(*perms)


class Migration(migrations.Migration):

    dependencies = [
        ("company", "0003_customers_quotes_invoices_proposals"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="quote",
            options={"ordering": ["tenant", "number"],
                     "permissions": [("approve_quote", "Can approve quotes (their emails are then sent)")]},
        ),
        migrations.RunPython(grant, revoke),
    ]
