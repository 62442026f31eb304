"""The sample pruner (`jobs_readytenant_prune`, migration 0013) keeps one
plan per connection for each of its two statements.

PL/pgSQL plans a statement that reads a variable like a prepared one: a
custom plan for the values of each of the first five calls, then the
generic plan only if it is estimated no dearer. Both statements name their
tenants by an array (`tenant = ANY(...)`), whose length the generic plan
takes for ten while the call's own holds one or two: the custom plan always
looks cheaper, so each call is planned anew, and planning costs more than
the call's work. With many tenants of a job or two the fair claim calls it
on nearly every job.

The generic plans read each tenant's READY jobs by the claim index, at any
table size (tests/jobs/test_claim_scale_pg.py checks the delete's), and
jobs_readytenant (one row per tenant with work) by its key once it is more
than a few pages; a smaller one is read whole. A plan is made again when
(auto)vacuum or ANALYZE updates the table's size."""

from django.db import migrations

FUNCTION = "jobs_readytenant_prune(varchar[])"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER FUNCTION {FUNCTION} SET plan_cache_mode = force_generic_plan")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER FUNCTION {FUNCTION} RESET plan_cache_mode")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0022_finished_indexes_by_time"),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
