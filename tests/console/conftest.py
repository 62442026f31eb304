"""People and jobs for the console tests: two tenants, a user per role in
`studio` (groups from the data migration, memberships from company), and a
reviewer of `acme` who must never see `studio`'s jobs; and the browser the
console's Playwright tests drive (Debian's Chromium)."""

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Group

from jobs.models import Job, JobEvent
from jobs.store import Store
from tests.factories import MembershipFactory, TenantFactory


def newest_event(job) -> int:
    return JobEvent.objects.filter(job=job).order_by("-id").values_list("id", flat=True).first()


def ensure_roles():
    """The groups of the data migration. A transactional test flushes every
    table after it runs (and only permissions are re-created by Django), so
    the tests that follow one re-create them the way the migration does."""
    from importlib import import_module

    from django.apps import apps

    import_module("company.migrations.0002_console_roles").create_roles(apps, None)
    import_module("company.migrations.0004_quote_approval_permission").grant(apps, None)
    import_module("operations.migrations.0003_operation_action_effect_limits").operators_manage_limits(apps, None)
    import_module("gateway.migrations.0002_operators_manage_agents").grant(apps, None)


@pytest.fixture
def tenants(db):
    ensure_roles()
    return TenantFactory(slug="studio"), TenantFactory(slug="acme")


@pytest.fixture
def people(tenants):
    studio, acme = tenants

    def person(name, group, tenant, role):
        return MembershipFactory(user__username=name, user__groups=[Group.objects.get(name=group)], tenant=tenant,
                                 role=role).user

    return {
        "reviewer": person("rita", "reviewers", studio, "reviewer"),
        "operator": person("otto", "operators", studio, "operator"),
        "viewer": person("vera", "viewers", studio, "viewer"),
        "other": person("alex", "reviewers", acme, "reviewer"),
    }


def make_job(key, state, *, tenant="studio", action="jobs.noop", payload=None):
    """A job in `state`, reached through the Store as a worker would."""
    store = Store()
    store.enqueue(tenant, key, action=action, payload=payload or {})
    if state == "READY":
        return Job.objects.get(tenant=tenant, key=key)
    epoch = store.claim(tenant, key, "w1")
    if state == "WAITING_REVIEW":
        store.fail(tenant, key, "w1", epoch, error="the provider rejected the address", failure="permanent")
    elif state == "NEEDS_ATTENTION":
        store.fail(tenant, key, "w1", epoch, error="401 from the provider", failure="auth")
    elif state == "DONE":
        store.finish(tenant, key, "w1", epoch)
    return Job.objects.get(tenant=tenant, key=key)


def decide(client, job, decision, note="checked it", **extra):
    return client.post(f"/admin/console/jobs/{job.pk}/decide/{decision}/",
                       {"note": note, "seen_event": newest_event(job), **extra})


# ---------------------------------------------------------------- the browser tests' fixtures

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PASSWORD = "pw"


@pytest.fixture(scope="module")
def allow_sync_orm_beside_playwright():
    """Playwright's sync API runs an event loop in this thread; the test's own
    ORM calls are plain synchronous ones between browser steps. Allowed for
    the modules that drive a browser only (`browser` asks for it), so no
    other test (or process it starts) inherits it."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def browser(allow_sync_orm_beside_playwright):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture
def sign_in(browser, live_server):
    """A signed-in page of its own (a fresh browser context) for a user."""
    contexts = []

    def as_(user):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(f"{live_server.url}/admin/login/")
        page.get_by_label("Username").fill(user.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/admin/")
        contexts.append(context)
        return page

    yield as_
    for context in contexts:
        context.close()


@pytest.fixture
def login(sign_in, people):
    """A signed-in page for one of `people` by role ("reviewer", …)."""
    return lambda role: sign_in(people[role])


def shot(page, name):
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def decide_in_form(page, label, note):
    form = page.get_by_role("form", name=label)
    form.get_by_label("Note (required)").fill(note)
    form.get_by_role("button", name=label).click()
