from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from gateway.api import api as gateway_api
from jobs import monitoring

urlpatterns = [
    # The console is the product: `/` opens it (the admin's login first when needed).
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
    path("admin/console/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("hooks/", include("jobs.urls")),
    path("api/v1/", gateway_api.urls),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    path("readyz", monitoring.readyz, name="readyz"),
]
