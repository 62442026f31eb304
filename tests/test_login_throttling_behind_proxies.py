"""Admin logins are throttled per username and client address (django-axes),
and the client address is the real one behind REVERSE_PROXY_COUNT reverse
proxies (django-ipware reads X-Forwarded-For): an attacker's failures lock
out the attacker's address for that username, never the real user logging in
from another address, and what a client writes into X-Forwarded-For itself
is never counted as its address."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run in a process whose settings are read from REVERSE_PROXY_COUNT, as a
# deployment's are. Each proxy appends the address it received the request
# from to X-Forwarded-For; the last one (10.0.0.2) is Django's peer.
SCENARIO = """
import json, os
from django.contrib.auth import get_user_model
from django.test import Client

User = get_user_model()
User.objects.create_superuser("ops", "ops@example.com", "correct horse battery staple")
User.objects.create_superuser("rita", "rita@example.com", "another long passphrase")
PROXY = "10.0.0.2"
INNER_PROXIES = [f"10.0.1.{n}" for n in range(1, int(os.environ["REVERSE_PROXY_COUNT"]))]

def login(client_address, username, password, *, written_by_client=""):
    forwarded = ", ".join(filter(None, [written_by_client, client_address, *INNER_PROXIES]))
    response = Client(HTTP_HOST="localhost").post(
        "/admin/login/", {"username": username, "password": password},
        REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=forwarded)
    return response.status_code

ATTACKER, USER = "198.51.100.7", "203.0.113.9"
outcome = {
    # Five wrong passwords from one client, each claiming another address.
    "attacker_failures": [login(ATTACKER, "ops", "wrong", written_by_client=f"192.0.2.{n}") for n in range(5)],
    "attacker_with_the_right_password": login(ATTACKER, "ops", "correct horse battery staple"),
    "attacker_claiming_the_users_address": login(ATTACKER, "ops", "correct horse battery staple",
                                                 written_by_client=USER),
    "another_user_from_the_attackers_address": login(ATTACKER, "rita", "another long passphrase"),
    "the_real_user_from_their_address": login(USER, "ops", "correct horse battery staple"),
}
print("OUTCOME " + json.dumps(outcome))
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("proxies", [1, 2])
def test_behind_proxies_an_attacker_locks_out_only_their_own_address_for_that_username(manage, proxies):
    manage.env = {**manage.env, "REVERSE_PROXY_COUNT": str(proxies)}
    result = manage.run("shell", "-c", SCENARIO)
    line = next(line for line in result.stdout.splitlines() if line.startswith("OUTCOME "))
    outcome = json.loads(line.removeprefix("OUTCOME "))

    assert outcome["attacker_failures"] == [200, 200, 200, 200, 429]  # the fifth failure locks out
    assert outcome["attacker_with_the_right_password"] == 429
    assert outcome["attacker_claiming_the_users_address"] == 429
    assert outcome["another_user_from_the_attackers_address"] == 302
    assert outcome["the_real_user_from_their_address"] == 302


@pytest.mark.django_db
def test_reached_directly_a_client_cannot_escape_the_lock_out_by_writing_x_forwarded_for(client,
                                                                                       django_user_model):
    # No REVERSE_PROXY_COUNT: the peer's address is the client's; the header is the client's own words.
    django_user_model.objects.create_superuser("ops", "ops@example.com", "correct horse battery staple")
    for n in range(5):
        client.post("/admin/login/", {"username": "ops", "password": "wrong"}, REMOTE_ADDR="198.51.100.7",
                    HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
    locked = client.post("/admin/login/", {"username": "ops", "password": "correct horse battery staple"},
                         REMOTE_ADDR="198.51.100.7", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert locked.status_code == 429
    elsewhere = client.post("/admin/login/", {"username": "ops", "password": "correct horse battery staple"},
                            REMOTE_ADDR="203.0.113.9")
    assert elsewhere.status_code == 302


@pytest.mark.parametrize("environment, refusal", [
    ({"AXES_IPWARE_PROXY_COUNT": "1"}, "AXES_IPWARE_PROXY_COUNT is replaced by REVERSE_PROXY_COUNT"),
    ({"REVERSE_PROXY_COUNT": "-1"}, "REVERSE_PROXY_COUNT must be 0 or more"),
])
def test_a_proxy_count_that_would_not_work_is_refused_at_start_up(environment, refusal):
    env = {**{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
           "DJANGO_SETTINGS_MODULE": "durable.settings", **environment}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and refusal in result.stderr
