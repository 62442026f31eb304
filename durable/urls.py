from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/console/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("hooks/", include("jobs.urls")),
]
