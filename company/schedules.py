"""The business's schedule functions for django-q2 (allow-listed in
`settings.DURABLE_SCHEDULES`; see `jobs.schedules`). They only create durable
obligations under business keys; `run_worker` does the work."""

from jobs.schedules import intended_day
from jobs.store import Store

from .models import Tenant

PLAN_ACTION = "company.plan_invoice_reminders"


def plan_invoice_reminders(intended_date: str | None = None) -> dict:
    """Enqueue, per tenant, the day's invoice-reminder planning job
    `invoice-reminder-plan-<YYYY-MM-DD>` (contract C6). The day is the one the
    trigger was scheduled for, so a late or repeated trigger finds the job it
    already created and creates nothing."""
    day = intended_day(intended_date)
    store = Store()
    tenants = []
    for slug in Tenant.objects.order_by("slug").values_list("slug", flat=True).iterator():
        store.enqueue(slug, f"invoice-reminder-plan-{day}", action=PLAN_ACTION, payload={"date": day},
                      actor="schedule:invoice-reminder-plan")
        tenants.append(slug)
    return {"date": day, "tenants": tenants}
