"""A LEASED job's claim time is its `updated_at`; `jobs_job.claimed_at` goes.

PostgreSQL logs an update as the bytes between the first and the last
column it changes. `claimed_at` was the table's last column, so every claim
(which changes `state`, column 9) logged the row from `state` to the end —
the search text, the proposer, whatever they hold — and a READY row's NULL
there made the claimed version 8 bytes longer, so it moved page more often.
The claim already set `updated_at` to the same time; a renewal does not
move it, and the row that ends an attempt copies it into the history as
the attempt's `claimed_at` (`JobEvent.claimed_at` stays). The columns a
claim changes come before the widest ones (docs/internals/schema.md,
"`jobs_job`").

A job LEASED when this runs keeps its attempt's claim time only if nothing
but the claim set its `updated_at` — a renewal by a worker of the previous
version moved it; its history row then names the last renewal's time.
Workers of an earlier release name the column in their claim and finish:
stop them before migrating (until they are restarted on this release each
of their claims fails with "column does not exist" and writes nothing; the
jobs they hold are recovered when their leases expire). Dropping the column
rewrites nothing on PostgreSQL. SQLite rebuilds
jobs_job, and the rebuilt table loses the hand-made claim index: it is made
again as migration 0010 does."""

from django.db import migrations

# (SQLite only; a no-op on PostgreSQL.)
from ._frozen import restore_claim_index


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0019_job_table_fillfactor'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='job',
            name='claimed_at',
        ),
        migrations.RunPython(restore_claim_index, migrations.RunPython.noop),
    ]
