import factory

from jobs.models import Job


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job
        django_get_or_create = ("tenant", "key")

    tenant = "studio"
    key = factory.Sequence(lambda n: f"job-{n:05d}")
    action = "jobs.noop"
