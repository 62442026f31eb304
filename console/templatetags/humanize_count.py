from django import template

register = template.Library()


@register.filter
def thousands(value):
    """1000000 → 1,000,000 (without enabling django.contrib.humanize)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return value
