from django import template

from jobs.access import may_view_jobs, request_scope
from jobs.health import queue_health
from jobs.states import State

register = template.Library()


@register.inclusion_tag("console/health_panel.html", takes_context=True)
def queue_health_panel(context):
    """Queue health for the tenants the user sees — the figures
    `manage.py queue_health` prints (one selector, `jobs.health`)."""
    request = context["request"]
    if not may_view_jobs(request.user):
        return {"hidden": True}
    scope = request_scope(request)
    health = queue_health(tenants=None if scope.everything else scope.tenants())
    tenants = list(health.job_health.by_tenant)
    by_state = [{"state": str(state), "label": state.label,
                 "cells": [{"tenant": t, "n": health.job_health.by_tenant[t].get(state, 0)} for t in tenants]}
                for state in State]
    return {"h": health, "tenants": tenants, "by_state": by_state, "request": request}


@register.filter
def age(seconds):
    """A waiting time for a person: 42s, 3.5 min, 2.1 h, 3.0 days; — for none."""
    if seconds is None or seconds == "":
        return "—"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
