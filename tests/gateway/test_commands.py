"""`manage.py agent_create` and `agent_key` as DESIGN §15 says: the key alone
on the last line, shown once; a tenant that does not exist is an error."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from gateway.keys import KEY_PATTERN
from gateway.models import Agent, ApiKey
from gateway.services import agent_authenticate


def run(*args) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue().rstrip("\n").split("\n")


def test_agent_create_prints_the_key_alone_on_the_last_line(tenant):
    lines = run("agent_create", "--tenant", "studio", "--name", "claude", "--actions",
                "connectors.send_email,company.send_quote", "--callback-url", "https://agent.example/hook")
    key = lines[-1]
    assert KEY_PATTERN.match(key)
    agent = agent_authenticate(f"Bearer {key}")
    assert agent.name == "claude" and agent.actions == ["company.send_quote", "connectors.send_email"]
    assert agent.callback_url == "https://agent.example/hook" and agent.callback_secret
    assert f"callback secret: {agent.callback_secret}" in lines


def test_agent_create_without_actions_allows_every_action_with_a_schema(tenant):
    key = run("agent_create", "--tenant", "studio", "--name", "claude")[-1]
    assert agent_authenticate(f"Bearer {key}").actions is None


@pytest.mark.parametrize("args, message", [
    (["--tenant", "nowhere", "--name", "x"], "no tenant"),
    (["--tenant", "studio", "--name", "x", "--actions", "jobs.noop"], "not proposable"),
    (["--tenant", "studio", "--name", "bad name"], "name"),
    (["--tenant", "studio", "--name", "x", "--callback-url", "http://10.0.0.5/hook"], "private"),
])
def test_agent_create_refuses_what_it_cannot_create(tenant, args, message):
    with pytest.raises(CommandError, match=message):
        run("agent_create", *args)
    assert not Agent.objects.exists()


def test_agent_key_issues_a_new_key_last_and_revokes_by_prefix(tenant):
    first = run("agent_create", "--tenant", "studio", "--name", "claude")[-1]
    second = run("agent_key", "--tenant", "studio", "--name", "claude", "--new")[-1]
    assert KEY_PATTERN.match(second) and second != first
    prefix = first.split("_")[1]
    lines = run("agent_key", "--tenant", "studio", "--name", "claude", "--revoke", prefix)
    assert f"key {prefix} of agent claude revoked" in lines[-1]
    assert ApiKey.objects.get(prefix=prefix).revoked_at is not None
    with pytest.raises(CommandError, match="no key with prefix"):
        run("agent_key", "--tenant", "studio", "--name", "claude", "--revoke", "0000000000")
    with pytest.raises(CommandError, match="no agent named"):
        run("agent_key", "--tenant", "studio", "--name", "nobody", "--new")
