"""Every page is served with a Content-Security-Policy that allows no inline
script or style, and the admin's and the console's pages need none: their
scripts and styles are static files (the browser test checks Chromium
reports no violation)."""

from html.parser import HTMLParser

import pytest

from tests.factories import OperationFactory, UserFactory

from .conftest import make_job

pytestmark = pytest.mark.django_db


class InlineCode(HTMLParser):
    """What a policy without 'unsafe-inline' blocks: <style> elements, style
    attributes, scripts without src (JSON data blocks are not run), on…
    handler attributes and javascript: URLs."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "style":
            self.found.append("<style>")
        if tag == "script" and not attrs.get("src") and attrs.get("type") != "application/json":
            self.found.append("<script> without src")
        for name, value in attrs.items():
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=…>")
            if name in ("href", "src", "action") and (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:…>")


def pages(people):
    job = make_job("quote-1", "NEEDS_ATTENTION")
    make_job("quote-2", "WAITING_REVIEW")
    op = OperationFactory(job=job, provider="sim-bare", request={"to": "ada@example.com"}, state="UNKNOWN")
    return ["/admin/", "/admin/console/review/", "/admin/console/attention/", f"/admin/console/jobs/{job.pk}/",
            f"/admin/console/jobs/{job.pk}/timeline/", "/admin/jobs/job/", f"/admin/jobs/job/{job.pk}/change/",
            "/admin/jobs/timer/", "/admin/jobs/inboundevent/", "/admin/operations/operation/",
            f"/admin/operations/operation/{op.pk}/change/", f"/admin/operations/operation/{op.pk}/decide/",
            "/admin/company/quote/", "/admin/company/customer/", "/admin/company/invoice/",
            "/admin/django_q/schedule/", "/admin/auth/user/"]


def test_every_page_is_served_with_a_policy_that_allows_no_inline_code(client, people):
    assert client.get("/admin/login/")["Content-Security-Policy"]
    client.force_login(UserFactory(username="root", superuser=True))
    for url in pages(people):
        response = client.get(url)
        assert response.status_code == 200, url
        policy = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
        assert (policy["script-src"], policy["style-src"], policy["object-src"]) == ("'self'", "'self'", "'none'")
        assert "unsafe" not in response["Content-Security-Policy"]


def test_the_admin_and_console_pages_carry_no_inline_script_or_style(client, people):
    def inline_code(response) -> list[str]:
        parser = InlineCode()
        parser.feed(response.content.decode())
        return parser.found

    found = {"/admin/login/": inline_code(client.get("/admin/login/"))}
    client.force_login(UserFactory(username="root", superuser=True))
    for url in pages(people):
        found[url] = inline_code(client.get(url))
    assert {url: what for url, what in found.items() if what} == {}
