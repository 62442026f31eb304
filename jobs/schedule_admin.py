"""django-q2's Schedule in the admin, narrowed to its role (DESIGN §13):
anyone with view permission may look; only a superuser may add, change or
delete one, and `func` is chosen from the allow-listed schedule functions
(`jobs.schedules`), with no result hook. Imported by `jobs.admin`, which the
admin autodiscovers after django_q's own admin (INSTALLED_APPS order)."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django_q.admin import ScheduleAdmin
from django_q.models import Schedule

from .admin_scope import OfferedLookupsOnly
from .schedules import INTENDED_DATE_KWARG, allowed_schedule_functions, schedule_validate


class CalendarScheduleForm(forms.ModelForm):
    func = forms.ChoiceField(choices=(), help_text="One of this project's schedule functions.")

    class Meta:
        model = Schedule
        fields = ["name", "func", "schedule_type", "minutes", "repeats", "next_run", "cluster"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        choices = sorted(allowed_schedule_functions())
        current = self.instance.func if self.instance and self.instance.pk else None
        if current and current not in choices:
            choices.append(current)  # shown so the refusal below can say what is wrong
        self.fields["func"].choices = [(c, c) for c in choices]

    def clean(self):
        data = super().clean()
        try:
            schedule_validate(func=data.get("func", ""), hook=None)
        except ValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        return data

    def save(self, commit=True):
        schedule = super().save(commit=False)
        schedule.hook = None
        # Our functions derive their business key from the scheduled time.
        schedule.intended_date_kwarg = INTENDED_DATE_KWARG
        if commit:
            schedule.save()
        return schedule


class CalendarScheduleAdmin(OfferedLookupsOnly, ScheduleAdmin):
    form = CalendarScheduleForm

    def has_add_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser


admin.site.unregister(Schedule)
admin.site.register(Schedule, CalendarScheduleAdmin)
