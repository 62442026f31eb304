from django.contrib import admin
from django.urls import include, path

from jobs import monitoring

urlpatterns = [
    path("admin/console/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("hooks/", include("jobs.urls")),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    path("readyz", monitoring.readyz, name="readyz"),
]
