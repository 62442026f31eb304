"""Production mode refuses unsafe configuration (DEBUG on, no secret key or
provider API key, a provider URL that is not https) and passes Django's deploy
checks; logins are throttled and weak passwords refused; server errors are
logged with their traceback."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PRODUCTION_ENV = {
    "DURABLE_PRODUCTION": "1",
    "SECRET_KEY": secrets.token_urlsafe(60),
    "PROVIDER_API_KEY": "live-key",
    "PROVIDER_URL": "https://mail.example.com",
    "ALLOWED_HOSTS": "durable.example.com",
}


def manage(*args, **env):
    base = {k: v for k, v in os.environ.items()
            if k not in ("DJANGO_SETTINGS_MODULE", "DEBUG", *PRODUCTION_ENV)}
    environment = {**base, "DJANGO_SETTINGS_MODULE": "durable.settings", **env}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_in_production_mode():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


@pytest.mark.parametrize("change, refusal", [
    ({"DEBUG": "1"}, "DEBUG=1 is refused when DURABLE_PRODUCTION=1"),
    ({"PROVIDER_API_KEY": ""}, "PROVIDER_API_KEY must be set"),
    ({"PROVIDER_URL": "http://mail.example.com"}, "PROVIDER_URL must be an https URL"),
    ({"SECRET_KEY": ""}, "SECRET_KEY must be set"),
    ({"GATEWAY_CALLBACK_ALLOW_PRIVATE": "1"}, "GATEWAY_CALLBACK_ALLOW_PRIVATE=1 is refused"),
])
def test_production_mode_refuses_unsafe_configuration(change, refusal):
    result = manage("check", **{**PRODUCTION_ENV, **change})
    assert result.returncode != 0
    assert refusal in result.stderr


def test_development_mode_needs_none_of_it():
    assert manage("check").returncode == 0


def test_the_proxy_header_is_read_from_the_environment():
    result = manage("shell", "-c", "from django.conf import settings; print(settings.SECURE_PROXY_SSL_HEADER)",
                    SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO=https", **PRODUCTION_ENV)
    assert "('HTTP_X_FORWARDED_PROTO', 'https')" in result.stdout, result.stderr


def test_a_server_error_is_logged_with_its_traceback():
    script = (
        "from unittest import mock\n"
        "from django.test import Client\n"
        "with mock.patch('jobs.views.inbound_event_receive', side_effect=RuntimeError('kaboom')):\n"
        "    response = Client(raise_request_exception=False).post('/hooks/sim/events', data=b'{}',"
        " content_type='application/json', HTTP_HOST='localhost')\n"
        "print('status', response.status_code)\n"
    )
    result = manage("shell", "-c", script)
    assert "status 500" in result.stdout, result.stderr
    assert "Internal Server Error: /hooks/sim/events" in result.stderr
    assert "RuntimeError: kaboom" in result.stderr and "Traceback" in result.stderr


@pytest.mark.django_db
def test_repeated_failed_logins_lock_the_account_out_even_with_the_right_password(client, django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "correct horse battery staple")
    for _ in range(5):
        failed = client.post("/admin/login/", {"username": "ops", "password": "wrong"})
        assert failed.status_code in (200, 429)
    locked = client.post("/admin/login/", {"username": "ops", "password": "correct horse battery staple"})
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_a_correct_login_still_works(client, django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "correct horse battery staple")
    client.post("/admin/login/", {"username": "ops", "password": "wrong"})
    ok = client.post("/admin/login/", {"username": "ops", "password": "correct horse battery staple"})
    assert ok.status_code == 302 and "_auth_user_id" in client.session


def test_weak_passwords_are_refused():
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        validate_password("password123")
