from django.urls import path

from . import views

app_name = "jobs"
urlpatterns = [
    # Included at /hooks/: POST /hooks/<provider>/events
    path("<slug:provider>/events", views.inbound_event_hook, name="inbound-events"),
]
