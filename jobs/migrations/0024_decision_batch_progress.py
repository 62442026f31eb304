"""A bulk decision records its progress item by item: a batch being taken
(TAKING) or cut off by an error on an item (INTERRUPTED) may be taken again
by its user for the items left, `progress_at` says when it last finished an
item (a batch that stopped moving was cut off), and first approvals of a
two-approver policy are counted apart from the decisions that released or
closed an item."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0023_prune_planned_once'),
    ]

    operations = [
        migrations.AddField(
            model_name='decisionbatch',
            name='first_approvals',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='decisionbatch',
            name='progress_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='decisionbatch',
            name='status',
            field=models.CharField(choices=[('PREVIEWED', 'Previewed'), ('TAKING', 'Being taken'), ('INTERRUPTED', 'Interrupted'), ('DONE', 'Done')], default='PREVIEWED', max_length=20),
        ),
    ]
