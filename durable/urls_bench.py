"""The site's URLs plus the gateway bench's reference endpoint
(`proving.bench_reference`), for the bench's server only
(`durable.settings_bench`)."""

from django.urls import path

from proving.bench_reference import reference

from .urls import urlpatterns as site_urlpatterns

urlpatterns = [path("bench/reference/", reference.urls), *site_urlpatterns]
