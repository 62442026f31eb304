from django.db import models


class BenchRow(models.Model):
    """One row of the gateway bench's reference endpoint
    (`proving.bench_reference`): what a minimal POST inserts."""

    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
