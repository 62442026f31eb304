"""DATABASE_POOL_MODE (DESIGN §17): behind a transaction-mode pooler nothing
may outlive a transaction — the settings turn prepared statements and
server-side cursors off — and a value that cannot work is refused at start-up
with a message saying why. Settings only: no database is reached."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432/durable_pool_settings"
SHOW = ("from django.conf import settings; import json; d = settings.DATABASES['default']; "
        "print(json.dumps({'jit': settings.DATABASE_JIT, 'options': d.get('OPTIONS', {}), 'no_cursors': d.get('DISABLE_SERVER_SIDE_CURSORS'), "
        "'mode': settings.DATABASE_POOL_MODE, 'listen': settings.DATABASE_LISTEN_URL, "
        "'prepared': settings.DATABASE_PREPARED_STATEMENTS}))")


def manage(*args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args],
                          env={**base, "DJANGO_SETTINGS_MODULE": "durable.settings", **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def settings_with(**env) -> dict:
    result = manage("shell", "-c", SHOW, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_transaction_mode_prepares_nothing_and_holds_no_cursor():
    seen = settings_with(DATABASE_URL=PG, DATABASE_POOL_MODE="transaction",
                         DATABASE_LISTEN_URL="postgres://postgres@10.0.0.5:5432/durable")
    assert seen["options"]["prepare_threshold"] is None
    assert seen["options"]["server_side_binding"] is False
    assert seen["no_cursors"] is True and seen["prepared"] is False
    assert seen["mode"] == "transaction" and seen["listen"].startswith("postgres://")


def test_direct_mode_keeps_prepared_statements():
    seen = settings_with(DATABASE_URL=PG)
    assert seen["mode"] == "direct" and seen["prepared"] is True
    assert seen["options"]["prepare_threshold"] == 2 and seen["options"]["server_side_binding"] is True
    assert settings_with(DATABASE_URL=PG, DATABASE_PREPARED_STATEMENTS="0")["prepared"] is False
    assert not seen["no_cursors"]
    # The connections turn JIT off as they open (jobs.pooling); options
    # given in DATABASE_URL are left as they are.
    assert seen["jit"] is False and "options" not in seen["options"]
    assert settings_with(DATABASE_URL=PG, DATABASE_JIT="1")["jit"] is True


@pytest.mark.parametrize("env, refusal", [
    ({"DATABASE_URL": PG, "DATABASE_POOL_MODE": "session"}, "DATABASE_POOL_MODE must be 'direct' or 'transaction'"),
    ({"DATABASE_POOL_MODE": "transaction"}, "DATABASE_POOL_MODE=transaction is for PostgreSQL"),
    ({"DATABASE_URL": PG, "DATABASE_POOL_MODE": "transaction", "DATABASE_PREPARED_STATEMENTS": "1"},
     "DATABASE_PREPARED_STATEMENTS=1 is refused with DATABASE_POOL_MODE=transaction"),
    ({"DATABASE_URL": PG, "DATABASE_LISTEN_URL": PG}, "DATABASE_LISTEN_URL is only used with DATABASE_POOL_MODE"),
    ({"DATABASE_URL": PG, "DATABASE_POOL_MODE": "transaction", "DATABASE_LISTEN_URL": "mysql://db/x"},
     "DATABASE_LISTEN_URL must be a postgres:// URL"),
])
def test_a_pool_configuration_that_cannot_work_is_refused_at_start_up(env, refusal):
    result = manage("check", **env)
    assert result.returncode != 0
    assert refusal in result.stderr, result.stderr
