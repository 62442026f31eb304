"""The agents of a tenant in the console: lists and pages only (read-only
evidence within the user's tenants, `ScopedAdmin`); operators create agents,
issue and revoke keys, pause and resume on pages that call one decision of
`gateway.decisions` each. A key is shown once, on the page that answers its
creation — never stored, never put in a message; elsewhere only its prefix.
The callback secret is never shown on a list or a change page."""

from django import forms
from django.contrib import admin, messages
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from jobs import access
from jobs.access import DecisionRefused
from jobs.actions import schema_actions
from jobs.admin_scope import ScopedAdmin, TenantFilter

from .decisions import (
    agent_create_decided,
    agent_key_issue_decided,
    agent_key_revoke_decided,
    agent_pause_decided,
    agent_resume_decided,
)
from .models import Agent, ApiKey, CallbackEvent


class NoteForm(forms.Form):
    note = forms.CharField(label="Note", widget=forms.Textarea(attrs={"rows": 2}), help_text="Why (kept in the history).")


class AgentCreateForm(forms.Form):
    tenant = forms.ChoiceField()
    name = forms.CharField(max_length=100, help_text="Unique in the tenant: letters, digits, '.', '_', '-'.")
    actions = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                        help_text="None ticked: every action that declares a payload schema.")
    callback_url = forms.CharField(required=False, max_length=500, label="Callback URL",
                                   help_text="Outcome events are POSTed here, signed (https in production).")
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), help_text="What the agent is for.")

    def __init__(self, *args, tenants=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [(t, t) for t in tenants]
        self.fields["actions"].choices = [(a, a) for a in schema_actions()]


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    fields = ("shown_prefix", "created_at", "created_by", "last_used_at", "revoked_at", "revoked_by", "revoke")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Key")
    def shown_prefix(self, key):
        return f"dwk_{key.prefix}_…"

    @admin.display(description="")
    def revoke(self, key):
        if key.revoked_at:
            return "—"
        url = reverse("admin:gateway_agent_revoke_key", args=[key.agent_id, key.prefix])
        return format_html('<a href="{}">Revoke…</a>', url)


@admin.register(Agent)
class AgentAdmin(ScopedAdmin):
    tenant_field = "tenant__slug"
    list_display = ("name", "tenant", "paused", "allowed_actions", "callback_url", "created_at")
    list_filter = ("paused", TenantFilter)
    list_select_related = ("tenant",)
    search_fields = ("name",)
    ordering = ("tenant__slug", "name")
    inlines = [ApiKeyInline]
    readonly_fields = ("manage",)
    fields = ("manage", "tenant", "name", "actions", "proposals_per_minute", "proposals_per_day", "callback_url",
              "paused", "paused_reason", "created_by", "created_at")

    def get_readonly_fields(self, request, obj=None):
        return self.fields  # the callback secret is not among them

    def has_add_permission(self, request, obj=None):
        return request.user.has_perm("gateway.manage_agent")

    def add_view(self, request, form_url="", extra_context=None):
        return redirect("admin:gateway_agent_create")

    @admin.display(description="Actions")
    def allowed_actions(self, agent):
        return ", ".join(agent.actions) if agent.actions is not None else "every action with a schema"

    @admin.display(description="Operator decisions")
    def manage(self, agent):
        links = [(reverse("admin:gateway_agent_new_key", args=[agent.pk]), "Issue a new key…"),
                 (reverse("admin:gateway_agent_resume" if agent.paused else "admin:gateway_agent_pause",
                          args=[agent.pk]), "Resume…" if agent.paused else "Pause (kill switch)…")]
        return format_html_join(" ", '<a class="button" href="{}">{}</a>', links)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("create/", view(self.create_view), name="gateway_agent_create"),
            path("<int:agent_id>/pause/", view(self.pause_view), name="gateway_agent_pause"),
            path("<int:agent_id>/resume/", view(self.resume_view), name="gateway_agent_resume"),
            path("<int:agent_id>/keys/new/", view(self.new_key_view), name="gateway_agent_new_key"),
            path("<int:agent_id>/keys/<str:prefix>/revoke/", view(self.revoke_view), name="gateway_agent_revoke_key"),
            *super().get_urls(),
        ]

    # ------------------------------------------------------------ pages (one decision each)

    def _page(self, request, title, *, agent=None, form=None, refused="", issued=None, intro="", status=200,
              show_secret=False):
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title,
                   "agent": agent, "form": form, "refused": refused, "issued": issued, "intro": intro,
                   "show_secret": show_secret}
        return TemplateResponse(request, "admin/gateway/agent/manage.html", context, status=status)

    def _visible(self, request, agent_id) -> Agent:
        return access.get_visible_or_404(Agent.objects.select_related("tenant"), request.user,
                                         scope=access.request_scope(request), tenant_field="tenant__slug", pk=agent_id)

    def create_view(self, request):
        scope = access.request_scope(request)
        tenants = [t for t in scope.tenants() if not access.refusal(request.user, "manage_agent", tenant=t,
                                                                     scope=scope)]
        if not tenants:
            raise Http404("no tenant whose agents you manage")
        form = AgentCreateForm(request.POST or None, tenants=tenants)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                agent, issued = agent_create_decided(user=request.user, tenant=data["tenant"], name=data["name"],
                                                     note=data["note"], actions=data["actions"] or None,
                                                     callback_url=data["callback_url"])
            except DecisionRefused as exc:
                form.add_error(None, str(exc))
            else:
                # The key is on this page only: not in a message, not in a redirect.
                return self._page(request, f"Agent {agent.name} created", agent=agent, issued=issued,
                                  show_secret=True)
        return self._page(request, "Create an agent", form=form)

    def _decision(self, request, agent_id, *, title, intro, decide, done):
        agent = self._visible(request, agent_id)
        refused = access.refusal(request.user, "manage_agent", tenant=agent.tenant.slug)
        form = NoteForm(request.POST or None)
        if request.method == "POST" and not refused and form.is_valid():
            try:
                result = decide(agent, form.cleaned_data["note"])
            except DecisionRefused as exc:
                form.add_error(None, str(exc))
            else:
                return done(agent, result)
        return self._page(request, title, agent=agent, form=None if refused else form, refused=refused, intro=intro,
                          status=403 if refused and request.method == "POST" else 200)

    def pause_view(self, request, agent_id):
        def done(agent, _):
            self.message_user(request, f"Agent {agent.name} paused: its proposals are refused and its jobs not yet "
                                       f"sent are held.", messages.SUCCESS)
            return redirect("admin:gateway_agent_change", agent.pk)

        return self._decision(request, agent_id, title="Pause the agent",
                              intro="Its new proposals are refused (423) and its jobs not yet dispatched are held "
                                    "until you resume it.",
                              decide=lambda agent, note: agent_pause_decided(user=request.user, agent_id=agent.pk,
                                                                             note=note), done=done)

    def resume_view(self, request, agent_id):
        def done(agent, result):
            self.message_user(request, f"Agent {agent.name} resumed; {result[1]} held job(s) go on.", messages.SUCCESS)
            return redirect("admin:gateway_agent_change", agent.pk)

        return self._decision(request, agent_id, title="Resume the agent", intro="Its held jobs go on at once.",
                              decide=lambda agent, note: agent_resume_decided(user=request.user, agent_id=agent.pk,
                                                                              note=note), done=done)

    def new_key_view(self, request, agent_id):
        return self._decision(
            request, agent_id, title="Issue a new key", intro="The key is shown once, on the next page.",
            decide=lambda agent, note: agent_key_issue_decided(user=request.user, agent_id=agent.pk, note=note),
            done=lambda agent, result: self._page(request, f"New key for {agent.name}", agent=agent,
                                                  issued=result[1]))

    def revoke_view(self, request, agent_id, prefix):
        def done(agent, _):
            self.message_user(request, f"Key {prefix} of {agent.name} revoked.", messages.SUCCESS)
            return redirect("admin:gateway_agent_change", agent.pk)

        return self._decision(request, agent_id, title=f"Revoke key {prefix}",
                              intro="From now on a request with it answers 401.",
                              decide=lambda agent, note: agent_key_revoke_decided(user=request.user, agent_id=agent.pk,
                                                                                  prefix=prefix, note=note), done=done)


@admin.register(CallbackEvent)
class CallbackEventAdmin(ScopedAdmin):
    tenant_field = "proposal__tenant"
    list_display = ("id", "type", "agent", "proposal", "job_key", "created_at")
    list_filter = ("type",)
    list_select_related = ("agent", "proposal")
    ordering = ("-created_at",)
