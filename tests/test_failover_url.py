"""A libpq multi-host DATABASE_URL (docs/howto/failover.md): the settings
pass every host, port and `target_session_attrs` on to psycopg, which hands
libpq a connection string naming all of them; a DATABASE_REPLICA_URL is
refused unless it and DATABASE_URL are PostgreSQL. Settings only: no
database is reached (the private-cluster drill, `make test-failover`, and
tests/test_replica_reads_pg.py connect)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHOW = ("import json; from django.db import connection; from psycopg.conninfo import conninfo_to_dict, make_conninfo; "
        "params = connection.get_connection_params(); "
        "print(json.dumps(conninfo_to_dict(make_conninfo(**{k: v for k, v in params.items() "
        "if k in ('host', 'port', 'dbname', 'user', 'target_session_attrs', 'connect_timeout')}))))")


def test_a_multi_host_url_reaches_libpq_with_every_host_and_the_read_write_target():
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}
    url = "postgres://app@db-a:5432,db-b:5433/durable?target_session_attrs=read-write&connect_timeout=3"
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", SHOW],
                            env={**base, "DJANGO_SETTINGS_MODULE": "durable.settings", "DATABASE_URL": url},
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    conninfo = json.loads(result.stdout.strip().splitlines()[-1])
    assert conninfo == {"host": "db-a,db-b", "port": "5432,5433", "dbname": "durable", "user": "app",
                        "target_session_attrs": "read-write", "connect_timeout": "3"}


def test_a_replica_url_is_refused_unless_both_databases_are_postgresql():
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}
    for primary, replica in (("sqlite:///tmp/x.sqlite3", "postgres://postgres@db-b:5432/durable"),
                             ("postgres://postgres@db-a:5432/durable", "sqlite:///tmp/x.sqlite3")):
        result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"],
                                env={**base, "DJANGO_SETTINGS_MODULE": "durable.settings", "DATABASE_URL": primary,
                                     "DATABASE_REPLICA_URL": replica},
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0
        assert "DATABASE_REPLICA_URL must be a postgres:// URL of a standby" in result.stderr
