"""The sample pruner (`jobs_readytenant_prune`, migration 0013) keeps one
plan per connection for each of its two statements (issue 24).

PL/pgSQL plans a statement that reads a variable like a prepared one: a
custom plan for the values of each of the first five calls, then the
generic plan only if it is estimated no dearer. Both statements name their
tenants by an array (`tenant = ANY(...)`), whose length the generic plan
takes for ten while the call's own holds one or two: the custom plan always
looked cheaper, so each call was planned anew — 0.2 ms of planning in a
0.34 ms call, one call per two jobs with 10,000 tenants of two jobs each.
Measured (4 processes, 20,000 jobs over 10,000 tenants): the delete planned
5,664 times in 5,670 calls before, 8 times in 5,652 after; the prune
0.343 → 0.079 ms a call; the fair claim that calls it 420 → 291 µs.

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
