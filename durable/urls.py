from django.contrib import admin
from django.urls import include, path

from gateway.api import api as gateway_api
from jobs import monitoring

urlpatterns = [
    path("admin/console/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("hooks/", include("jobs.urls")),
    path("api/v1/", gateway_api.urls),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    path("readyz", monitoring.readyz, name="readyz"),
]
