"""Operations on /metrics (`jobs.metrics`): the states still in doubt only —
ACCEPTED, REJECTED and FAILED are history that grows without bound; the
in-doubt states are few and served by `operation_state_tenant`."""

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from jobs.metrics import metric_families

from .models import IN_DOUBT, Operation


@metric_families("operations")
def operation_families():
    family = GaugeMetricFamily("durable_operations", "Operations in each state still in doubt.", labels=["state"])
    counts = dict(Operation.objects.filter(state__in=IN_DOUBT).values_list("state").annotate(n=Count("id"))
                  .order_by())
    for state in sorted(IN_DOUBT):
        family.add_metric([str(state)], counts.get(state, 0))
    yield family
