"""Autovacuum for the job table and the fair claim's tenant sample
(`jobs.tablestorage`); PostgreSQL only.

Every job leaves two dead versions of its row behind (the claim and the
finish update it, never in place: both change `state`, which the partial
indexes name), and retention deletes finished jobs by the million: with
PostgreSQL's default a fifth of the table would be dead before a vacuum.
The tenant sample gains and loses a row whenever a tenant gets work or runs
out of it."""

from django.db import migrations

from ._frozen import DELETED_IN_BULK, table_storage


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0015_jobsearch'),
    ]

    operations = [
        table_storage({
            "jobs_job": DELETED_IN_BULK,
            "jobs_readytenant": DELETED_IN_BULK,
        }),
    ]
