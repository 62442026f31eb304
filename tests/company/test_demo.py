"""`make demo` runs `manage.py demo`: the story must work end to end."""

import pytest


@pytest.mark.django_db(transaction=True)
def test_demo_story_sends_each_email_once_and_explains_the_exceptions(manage):
    out = manage.run("demo", "--emails", "3", "--run", "t1", timeout=240).stdout
    assert "provider holds 3 quote messages for 3 quote emails (most for one email: 1)" in out
    assert "NEEDS_ATTENTION mystery-t1: no handler is registered for action 'demo.not_registered'" in out
    assert "WAITING_REVIEW quote-t1-typo" in out and "'to' must be an email address" in out
    assert "DONE               4" in out  # three emails and the job that waited for a reply
    # A second run under the same name changes nothing.
    again = manage.run("demo", "--emails", "3", "--run", "t1", timeout=240).stdout
    assert "DONE               4" in again
