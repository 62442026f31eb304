"""Test-only subject models (the business app uses the engine the same way)."""

from django.db import models


class Invoice(models.Model):
    """A subject timers re-read: `version` moves on every change of terms."""

    tenant = models.CharField(max_length=64, default="studio")
    number = models.CharField(max_length=40)
    due_date = models.DateField()
    version = models.PositiveIntegerField(default=1)
    paid = models.BooleanField(default=False)
    suppressed = models.BooleanField(default=False)

    def __str__(self):
        return f"{self.tenant}/{self.number} v{self.version}"


class Delivery(models.Model):
    """One delivery of an outbox event to a test consumer, in delivery order
    (the auto id), duplicates included: the evidence for order and dedupe."""

    event_id = models.UUIDField()
    aggregate_id = models.CharField(max_length=100)
    sequence = models.PositiveBigIntegerField()
    consumer = models.CharField(max_length=50)

    class Meta:
        ordering = ["id"]
