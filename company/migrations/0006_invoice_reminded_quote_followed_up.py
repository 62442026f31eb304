"""A business effect is recorded on its business record, not inferred from a
job (retention deletes finished jobs): `Invoice.reminded_at` and
`reminder_reference` (the reminder the provider accepted) and
`Quote.followed_up_at` (the follow-up email it accepted). Filled here from
the receipts of the reminder and follow-up jobs that still exist, so an
invoice reminded before this migration is not reminded again."""

from django.db import migrations, models

# The business keys of company.names at the time of this migration.
REMINDER_KEY = "invoice-reminder-{}"
FOLLOW_UP_KEY = "quote-follow-up-{}"


def _accepted(Operation, tenant: str, key: str, step: str):
    return (Operation.objects.filter(tenant=tenant, job__key=key, step=step, state="ACCEPTED")
            .select_related("receipt").first())


def backfill(apps, schema_editor):
    Invoice = apps.get_model("company", "Invoice")
    Quote = apps.get_model("company", "Quote")
    Operation = apps.get_model("operations", "Operation")
    for invoice in Invoice.objects.select_related("tenant").filter(reminded_at__isnull=True).iterator():
        operation = _accepted(Operation, invoice.tenant.slug, REMINDER_KEY.format(invoice.number), "reminder")
        if operation is not None:
            Invoice.objects.filter(pk=invoice.pk).update(reminded_at=operation.receipt.accepted_at,
                                                         reminder_reference=operation.receipt.provider_reference)
    for quote in Quote.objects.select_related("tenant").filter(followed_up_at__isnull=True).iterator():
        operation = _accepted(Operation, quote.tenant.slug, FOLLOW_UP_KEY.format(quote.number), "follow-up")
        if operation is not None:
            Quote.objects.filter(pk=quote.pk).update(followed_up_at=operation.receipt.accepted_at)


class Migration(migrations.Migration):

    dependencies = [
        ('company', '0005_review_policy_and_digest'),
        ('operations', '0004_growing_tables_storage'),
    ]

    operations = [
        migrations.AddField(
            model_name='invoice',
            name='reminded_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='invoice',
            name='reminder_reference',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='quote',
            name='followed_up_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
