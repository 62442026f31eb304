"""Valid rows in one call, for tests that need a row as a precondition, not
the path that creates it. A test names only the fields its outcome depends
on; everything else takes a plain, valid default here.

Jobs, quotes, customers and invoices are not built here: tests create them
through `Store().enqueue(...)` and the company services, which write their
events and outbox rows as production does. These factories are for rows that
a test plants directly: an operation in some state, a pause, a quarantined
outbox event, an overdue timer, the people of the console."""

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from company.models import Membership, Tenant
from jobs.models import InboundEvent, Job, JobSearch, OutboxEvent, Timer
from jobs.search import search_text_for
from operations.digest import intent_key
from operations.models import ConnectorPause, Operation, OperationState, Receipt, ReceiptHow


class JobSearchFactory(factory.django.DjangoModelFactory):
    """A job's search row (jobs.search), as the Store writes it with the job."""

    class Meta:
        model = JobSearch

    tenant = factory.LazyAttribute(lambda row: row.job.tenant)
    key = factory.LazyAttribute(lambda row: row.job.key)
    search_text = factory.LazyAttribute(lambda row: row.job.search_text or search_text_for(row.job))


class JobFactory(factory.django.DjangoModelFactory):
    """A READY job row with no history (and its search row); only a stand-in
    where a test needs a job to hang another row on. A test of the engine
    enqueues through the Store."""

    class Meta:
        model = Job
        skip_postgeneration_save = True

    tenant = "studio"
    key = factory.Sequence(lambda n: f"job-{n:05d}")
    action = "jobs.noop"
    search = factory.RelatedFactory(JobSearchFactory, factory_related_name="job")


# ---------------------------------------------------------------- operations


class OperationFactory(factory.django.DjangoModelFactory):
    """An email send of a job's `send` step, INTENDED unless told otherwise;
    its tenant is its job's."""

    class Meta:
        model = Operation

    job = factory.SubFactory(JobFactory, action="connectors.send_email")
    tenant = factory.LazyAttribute(lambda operation: operation.job.tenant)
    step = "send"
    provider = "sim-idempotent"
    kind = "email.send"
    request_digest = "d" * 64
    intent_key = factory.LazyAttribute(lambda operation: intent_key(
        tenant=operation.tenant, job_key=operation.job.key, step=operation.step, digest=operation.request_digest))
    request = factory.LazyFunction(lambda: {"to": "a@example.com"})
    state = OperationState.INTENDED


class ReceiptFactory(factory.django.DjangoModelFactory):
    """The provider's direct answer that it accepted the operation, now."""

    class Meta:
        model = Receipt

    operation = factory.SubFactory(OperationFactory, state=OperationState.ACCEPTED)
    provider_reference = factory.Sequence(lambda n: f"msg_{n}")
    accepted_at = factory.LazyFunction(timezone.now)
    how = ReceiptHow.DIRECT
    recorded_by = "w1"


class ConnectorPauseFactory(factory.django.DjangoModelFactory):
    """A pause in force: the provider answered 401 to the tenant's credentials."""

    class Meta:
        model = ConnectorPause

    tenant = "studio"
    provider = "sim-idempotent"
    status_code = 401
    reason = factory.LazyAttribute(lambda pause: str(pause.status_code))


# ---------------------------------------------------------------- outbox, timers, inbound events


class OutboxEventFactory(factory.django.DjangoModelFactory):
    """The first event of its own aggregate, PENDING, emitted now."""

    class Meta:
        model = OutboxEvent

    tenant = "studio"
    aggregate_type = "quote"
    aggregate_id = factory.Sequence(str)
    sequence = 1
    event_type = "quote.sent"
    created_at = factory.LazyFunction(timezone.now)


class TimerFactory(factory.django.DjangoModelFactory):
    """A PENDING timer, set now and due now, bound to no job."""

    class Meta:
        model = Timer

    tenant = "studio"
    scheduled_for = factory.LazyFunction(timezone.now)
    reason = "reminder"
    created_at = factory.LazyFunction(timezone.now)


class InboundEventFactory(factory.django.DjangoModelFactory):
    """A reply no waiting job took: UNMATCHED, received now."""

    class Meta:
        model = InboundEvent

    provider = "sim"
    event_id = factory.Sequence(lambda n: f"e-{n}")
    event_type = "reply"
    state = InboundEvent.Status.UNMATCHED
    received_at = factory.LazyFunction(timezone.now)


# ---------------------------------------------------------------- tenants and people


class TenantFactory(factory.django.DjangoModelFactory):
    """A tenant named after its slug ("studio" → "Studio"), without a policy
    row (`tenant_ensure` adds one; a test that needs it calls the service)."""

    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda tenant: tenant.slug.title())


class UserFactory(factory.django.DjangoModelFactory):
    """A user with the password "pw"; `staff=True` opens the admin,
    `superuser=True` everything. `groups=[...]` adds the user to groups."""

    class Meta:
        model = get_user_model()
        # The groups hook needs no second save.
        skip_postgeneration_save = True

    class Params:
        staff = factory.Trait(is_staff=True)
        superuser = factory.Trait(is_staff=True, is_superuser=True)

    username = factory.Sequence(lambda n: f"user-{n}")
    password = factory.django.Password("pw")

    @factory.post_generation
    def groups(user, create, extracted, **kwargs):
        if create and extracted:
            user.groups.add(*extracted)


class MembershipFactory(factory.django.DjangoModelFactory):
    """A staff user acting for a tenant as reviewer, unless told another role."""

    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory, staff=True)
    tenant = factory.SubFactory(TenantFactory)
    role = Membership.Role.REVIEWER
