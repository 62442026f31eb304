"""Room in each page of the job table for the new versions of its rows
(`jobs.tablestorage`); PostgreSQL only.

A claim and a finish each write a new version of the job's row; neither can
be HOT (both change `state`, which the partial indexes name). Where the page
is packed full, the new version goes to another page, and PostgreSQL first
logs a lock on the old one and then the whole new row. With 30 % of each
page left free, the new version stays in its page and only the bytes that
changed are logged, for a somewhat larger table. Setting it
takes a brief SHARE UPDATE EXCLUSIVE lock and rewrites nothing: pages
filled from now on keep the room."""

from django.db import migrations

from ._frozen import table_storage


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0018_identity_in_jobsearch'),
    ]

    operations = [
        table_storage({"jobs_job": {"fillfactor": "70"}}),
    ]
