"""`make demo` runs `manage.py demo`: the company story must work end to end
(real simulator and worker processes, a SIGKILL after acceptance), without
serving the admin."""

import pytest
from django.contrib.auth import get_user_model

from company.models import Membership, Quote


@pytest.mark.django_db(transaction=True)
def test_demo_story_sends_each_email_once_and_tells_what_happened(manage, tmp_path):
    User = get_user_model()
    User.objects.create_user(username="reviewer", password="my-own-password")
    manage.env = {**manage.env, "DEMO_SERVE": "0", "DEMO_STATE_DIR": str(tmp_path / "demo-state")}
    out = manage.run("demo", "--tenant", "story", timeout=240).stdout

    assert "demo-worker-1 was killed with SIGKILL before the answer reached it" in out
    assert "resumed: its worker died holding it" in out and "reconciled by lookup instead of sending blind" in out
    for number, status in (("Q-0001", "ACCEPTED"), ("Q-0002", "SENT"), ("Q-0003", "DECLINED")):
        assert f"{number} to " in out and f": {status}; emails at the provider: 1; receipt: lookup" in out
    assert dict(Quote.objects.values_list("number", "status")) == {
        "Q-0001": "ACCEPTED", "Q-0002": "SENT", "Q-0003": "DECLINED"}
    assert "INV-0002" in out and "reminder cancelled: invoice INV-0002 is paid" in out
    assert "reminder cancelled: edsger@example.com suppressed reminders (disputes the invoice)" in out
    assert "INV-0004" in out and "reminder re-planned (the invoice changed)" in out
    assert "INV-0005" in out and "reminded once (receipt lookup)" in out
    assert "quote-follow-up-Q-0002: proposed by timer:quote-follow-up" in out
    assert "invoice-reminder-INV-0001: proposed by agent:rules" in out
    assert "proposed 1 new;" in out and "proposed 0 new" in out
    assert "the provider holds 4 message(s); most for one operation: 1" in out
    # An outside agent proposes over HTTP, a reviewer decides, its endpoint gets the signed callbacks.
    assert "POST http://127.0.0.1:" in out and "→ 201: outside-agent-hello-1 is WAITING_REVIEW" in out
    assert "the same POST again → 200, created: False" in out
    assert "rejected it in the console's decision service" in out
    for event in ("proposal.decided", "proposal.cancelled"):
        assert f"the agent's endpoint received {event}" in out
    assert "signature WRONG" not in out and "Idempotency-Key = event id: True" in out
    assert "CANCELLED, decision reject by admin" in out

    # An existing user is never changed; the others get their memberships (C4).
    reviewer = User.objects.get(username="reviewer")
    assert reviewer.check_password("my-own-password") and not reviewer.memberships.exists()
    assert "reviewer (existed, left unchanged)" in out
    assert Membership.objects.get(user__username="operator", tenant__slug="story").role == "operator"
    assert User.objects.get(username="admin").is_superuser

    # A second run on the same database tells the same story from the records.
    again = manage.run("demo", "--tenant", "story", timeout=240).stdout
    assert "told the story before" in again
    assert "the provider holds 4 message(s); most for one operation: 1" in again


@pytest.mark.django_db(transaction=True)
def test_demo_refuses_to_run_in_production(manage):
    # A complete production configuration, so it is the demo that refuses.
    manage.env = {**manage.env, "DURABLE_PRODUCTION": "1", "SECRET_KEY": "x" * 50, "DEMO_SERVE": "0",
                  "PROVIDER_API_KEY": "live-key", "PROVIDER_URL": "https://mail.example.com"}
    result = manage.run("demo", check=False, timeout=120)
    assert result.returncode != 0
    assert "refuses to run with DURABLE_PRODUCTION=1" in result.stderr
    assert not get_user_model().objects.exists()
