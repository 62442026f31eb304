"""The admin side of the tenant scope and of big tables (DESIGN §14, STYLE:
pages are bounded). Every ModelAdmin of the engine and of the apps above it builds on
`ScopedAdmin`: its lists, pages, filters, searches and autocompletes see only
the user's tenants (`jobs.access`), another tenant's object answers 404, and
no list counts the whole table."""

import json

from django.contrib import admin
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q
from django.http import Http404
from django.utils.functional import cached_property

from .access import masked_tenants, request_scope
from .actions import registered_actions

# Below this many estimated rows a list shows an exact count (cheap); above
# it the planner's estimate, marked as such.
EXACT_COUNT_BELOW = 10_000


class EstimatedCountPaginator(Paginator):
    """A paginator that asks PostgreSQL's planner how many rows a big list
    has instead of running `COUNT(*)` over a million rows; small results (and
    SQLite) are counted exactly."""

    estimated = False

    @cached_property
    def count(self):
        queryset = self.object_list
        connection = connections[getattr(queryset, "db", "default")]
        if connection.vendor == "postgresql" and hasattr(queryset, "query"):
            sql, params = queryset.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
                plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            rows = int(plan[0]["Plan"]["Plan Rows"])
            if rows >= EXACT_COUNT_BELOW:
                self.estimated = True
                return rows
        return super().count


class TenantFilter(admin.SimpleListFilter):
    """Tenants from the user's scope (the Tenant table), never a DISTINCT
    over a big table."""

    title = "tenant"
    parameter_name = "tenant"

    def __init__(self, request, params, model, model_admin):
        self.tenant_field = getattr(model_admin, "tenant_field", "tenant")
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        return [(slug, slug) for slug in request_scope(request).tenants()]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(**{self.tenant_field: self.value()})
        return queryset


class ActionFilter(admin.SimpleListFilter):
    """Actions from the registry, never a DISTINCT over the jobs table."""

    title = "action"
    parameter_name = "action"

    def lookups(self, request, model_admin):
        return [(name, name) for name in registered_actions()]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(action=self.value())
        return queryset


class OfferedLookupsChangeList(ChangeList):
    """A list that filters only by the parameters its page offers: its list
    filters' (each filter takes its own parameters out of the query string),
    its date hierarchy's, its search box's. Anything left — `payload__to__
    startswith=ana`, `search_text__icontains=…` — answers 400: Django's
    default would apply any lookup on a model's own fields, which lets a
    reader who sees a field masked read it letter by letter from the row count."""

    def get_filters(self, request):
        asked = self.get_filters_params()
        filters = super().get_filters(request)
        unoffered = set(filters[2])
        if self.date_hierarchy and f"{self.date_hierarchy}__year" in asked:
            # The bounds the date hierarchy made of its own year/month/day.
            unoffered -= {f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"}
        if unoffered:
            raise DisallowedModelAdminLookup(f"Filtering by {', '.join(sorted(unoffered))} is not offered here")
        return filters


class OfferedLookupsOnly:
    """The admin mixin every ModelAdmin of the project uses (through
    `ScopedAdmin`, or directly): its changelist filters only by what the page offers."""

    def get_changelist(self, request, **kwargs):
        return OfferedLookupsChangeList


class ScopedAdmin(OfferedLookupsOnly, admin.ModelAdmin):
    """Read-only evidence within the user's tenants. Changes happen only
    through decisions (services), never by editing a row."""

    tenant_field = "tenant"
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # Search fields holding values a reader of a tenant whose sensitive
    # fields they see masked (`access.masked_tenants`) must not find rows by:
    # in those tenants the search reads the other fields only.
    sensitive_search_fields: tuple[str, ...] = ()

    def get_search_results(self, request, queryset, search_term):
        masked = masked_tenants(request_scope(request)) if self.sensitive_search_fields else []
        term = search_term.strip()
        if not masked or not term:
            return super().get_search_results(request, queryset, search_term)
        in_masked = Q(**{f"{self.tenant_field}__in": masked})
        clear, duplicates = super().get_search_results(request, queryset.exclude(in_masked), search_term)
        plain = Q()
        for name in self.search_fields:
            if name not in self.sensitive_search_fields:
                lookup = {"=": "iexact", "^": "istartswith"}.get(name[:1], "icontains")
                plain |= Q(**{f"{name.lstrip('=^@')}__{lookup}": term})
        found = Q(pk__in=clear.values("pk"))
        if plain:
            found |= in_masked & plain
        return queryset.filter(found), duplicates

    def get_queryset(self, request):
        return request_scope(request).filter(super().get_queryset(request), self.tenant_field)

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            # Another tenant's object does not exist for this user (nor does a
            # missing one): 404, not the admin's "perhaps it was deleted" redirect.
            raise Http404("no such object")
        return obj

    def get_readonly_fields(self, request, obj=None):
        return [*(f.name for f in self.model._meta.fields), *self.readonly_fields]

    def history_masker(self, request, obj):
        """How this reader reads the History entries of `obj` (a decision's
        message quotes its note): None in clear; an app whose records hold
        sensitive values returns its masker (anything with `text(str)`)."""
        return None

    def history_view(self, request, object_id, extra_context=None):
        response = super().history_view(request, object_id, extra_context)
        context = getattr(response, "context_data", None) or {}
        masker = context.get("object") is not None and self.history_masker(request, context["object"])
        if masker:
            for entry in context["action_list"]:
                entry.change_message = masker.text(entry.change_message)
        return response

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        return request.user.has_perm("jobs.operate_job")
