"""Settings come from the environment (DESIGN §11); nothing secret lives here.

With no DATABASE_URL the embedded SQLite file `db.sqlite3` in the project is
used; `DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable` switches to
PostgreSQL.
"""

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # optional, for local overrides; never committed

DEBUG = env.bool("DEBUG", default=False)
# A development checkout (make demo, tests) runs without a secret; a production
# deployment sets DURABLE_PRODUCTION=1 and must then provide SECRET_KEY,
# PROVIDER_API_KEY and an https PROVIDER_URL (checked below, at start-up).
PRODUCTION = env.bool("DURABLE_PRODUCTION", default=False)
SECRET_KEY = env("SECRET_KEY", default="" if PRODUCTION else "insecure-development-only-key")
if not SECRET_KEY:
    raise environ.ImproperlyConfigured("SECRET_KEY must be set when DURABLE_PRODUCTION=1")
if PRODUCTION and DEBUG:
    raise environ.ImproperlyConfigured(
        "DEBUG=1 is refused when DURABLE_PRODUCTION=1: debug pages show settings and source to anyone"
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "axes",
    "django_tasks",
    "jobs",
    "review",
    "operations",
    "connectors",
    "company",
    "gateway",
    "console",
    "proving",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "durable.security.ContentSecurityPolicyMiddleware",
    # Static files (the admin's CSS) served by the application itself, with
    # DEBUG off, as in production (DESIGN §1: the console is the product).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it turns a locked-out login into its answer.
    "axes.middleware.AxesMiddleware",
]

# Content-Security-Policy (durable.security): scripts, styles, images and
# fonts from this origin only, no inline script or style, no plugins, no
# framing, forms post only here. The admin and the console work under it.
CONTENT_SECURITY_POLICY = env(
    "CONTENT_SECURITY_POLICY",
    default="default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
            "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for
# one username from one client address, that pair is locked out for
# AXES_COOLOFF_MINUTES — the attacker's address, never the real user's
# logging in from another one.
AUTHENTICATION_BACKENDS = ["durable.auth.LoginThrottleBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# The client address (django-ipware, as django-axes asks it). Reached
# directly: the peer's address (REMOTE_ADDR); X-Forwarded-For is then only
# the client's own words and is ignored. Behind REVERSE_PROXY_COUNT reverse
# proxies, each appending the address it received the request from to
# X-Forwarded-For: the address the outermost one saw, i.e. the entry
# REVERSE_PROXY_COUNT from the right. What a client writes into the header
# stays to the left of it and is never counted. Set it only when every
# request comes through those proxies.
if env("AXES_IPWARE_PROXY_COUNT", default=None) is not None:
    raise environ.ImproperlyConfigured(
        "AXES_IPWARE_PROXY_COUNT is replaced by REVERSE_PROXY_COUNT: the number of reverse proxies in front of "
        "Django (1 for one nginx)")
REVERSE_PROXY_COUNT = env.int("REVERSE_PROXY_COUNT", default=0)
if REVERSE_PROXY_COUNT < 0:
    raise environ.ImproperlyConfigured(f"REVERSE_PROXY_COUNT must be 0 or more, not {REVERSE_PROXY_COUNT}")
if REVERSE_PROXY_COUNT:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
    AXES_IPWARE_PROXY_ORDER = "left-most"
    # ipware counts the proxy addresses listed after the client's, and the
    # proxy nearest to Django is REMOTE_ADDR, not listed.
    AXES_IPWARE_PROXY_COUNT = REVERSE_PROXY_COUNT - 1
    # A longer header (entries the client wrote) still yields the entry our
    # proxies appended, instead of falling back to the proxy's own address.
    IPWARE_STRICT = False
else:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

if PRODUCTION:
    # HTTPS only (`manage.py check --deploy` is clean with these).
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    # Probes and scrapers inside the cluster may speak plain HTTP.
    SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[r"^healthz$", r"^readyz$", r"^metrics$"])
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Behind a TLS-terminating proxy, Django sees plain HTTP: name the header the
# proxy sets, e.g. SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO=https".
# Only when the proxy always sets (or strips) that header — otherwise a client
# could claim HTTPS itself. Without it behind such a proxy, SSL redirect loops.
if env("SECURE_PROXY_SSL_HEADER", default=""):
    _header, _, _value = env("SECURE_PROXY_SSL_HEADER").partition("=")
    SECURE_PROXY_SSL_HEADER = (_header.strip(), _value.strip() or "https")

ROOT_URLCONF = "durable.urls"
WSGI_APPLICATION = "durable.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.review_waiting",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# Workers are long-lived processes: a connection is kept from one claim to the
# next (reconnecting costs more than a claim). `?conn_max_age=N` in
# DATABASE_URL or CONN_MAX_AGE overrides it; a broken connection is dropped
# on its first error either way.
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=600))
ASGI_SERVED = env.bool("DURABLE_ASGI", default=False)
if ASGI_SERVED:
    # The web app under its ASGI server (durable.asgi sets this): each
    # request's sync work runs on a thread of its own, so a connection kept
    # past its request is never reused and stays open until the database
    # refuses new clients. Each request hands its connection back at its end
    # (Django's advice for ASGI): to a pool on PostgreSQL (below), else closed.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
# How the application reaches PostgreSQL (DESIGN §17): `direct` (or through
# a session-mode pooler, which keeps a server connection per client), or
# `transaction` behind a transaction-mode pooler (PgBouncer
# `pool_mode = transaction`), where consecutive transactions of one client
# may run on different server connections: then nothing may outlive a
# transaction — no prepared statements, no server-side (WITH HOLD) cursors,
# no LISTEN. Wake-ups then come through DATABASE_LISTEN_URL, a direct
# connection that only LISTENs (without it workers poll).
DATABASE_POOL_MODE = env("DATABASE_POOL_MODE", default="direct").strip().lower()
if DATABASE_POOL_MODE not in ("direct", "transaction"):
    raise environ.ImproperlyConfigured(
        f"DATABASE_POOL_MODE must be 'direct' or 'transaction' (behind a transaction-mode pooler such as "
        f"PgBouncer), not {env('DATABASE_POOL_MODE')!r}")
DATABASE_LISTEN_URL = env("DATABASE_LISTEN_URL", default="").strip()
_postgres = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if DATABASE_POOL_MODE == "transaction" and not _postgres:
    raise environ.ImproperlyConfigured(
        "DATABASE_POOL_MODE=transaction is for PostgreSQL behind a transaction-mode pooler; DATABASE_URL "
        "names another database")
if DATABASE_LISTEN_URL:
    if DATABASE_POOL_MODE != "transaction":
        raise environ.ImproperlyConfigured(
            "DATABASE_LISTEN_URL is only used with DATABASE_POOL_MODE=transaction (directly, a worker LISTENs "
            "on a connection it already holds)")
    if urlsplit(DATABASE_LISTEN_URL).scheme not in ("postgres", "postgresql"):
        # The scheme only: the URL may carry a password, and this is logged.
        raise environ.ImproperlyConfigured(
            f"DATABASE_LISTEN_URL must be a postgres:// URL of a direct connection to the same database, not a "
            f"{urlsplit(DATABASE_LISTEN_URL).scheme or 'scheme-less'!r} URL")
_prepared = env.bool("DATABASE_PREPARED_STATEMENTS", default=None)
if DATABASE_POOL_MODE == "transaction":
    if _prepared:
        raise environ.ImproperlyConfigured(
            "DATABASE_PREPARED_STATEMENTS=1 is refused with DATABASE_POOL_MODE=transaction: a prepared "
            "statement lives on one server connection and the pooler hands the next transaction another")
    # Django's default binding on the client, never preparing (psycopg's
    # prepare_threshold=None), and Django's iterator() without server-side
    # cursors (they are held across transactions).
    DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": False, "prepare_threshold": None})
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
elif _postgres and _prepared is not False:
    # Server-side binding lets psycopg prepare statements it runs repeatedly
    # (the claim statements' calls from their first run: `jobs.pooling.sending`),
    # so PostgreSQL parses and plans them once per connection — planning a
    # query of jobs_job (its indexes' predicates) costs more than running
    # it. A worker's housekeeping connection prepares none of its own
    # (`pooling.prepare_nothing_here`). Not behind a transaction-mode
    # pooler: set DATABASE_POOL_MODE=transaction there (a worker that finds
    # itself behind one refuses to run).
    DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": True, "prepare_threshold": 2})
DATABASE_PREPARED_STATEMENTS = (DATABASES["default"].get("OPTIONS", {}).get("server_side_binding") is True)
# PostgreSQL's JIT compiles a plan whose estimated cost passes jit_above_cost
# before running it, and compiling a claim that is a millisecond's work costs
# far more than running it; the claim's plan's estimate passes that mark
# under statistics an ANALYZE took while the queue was busy. Directly (or
# through a session-mode pooler) each connection of the application turns it
# off when it opens (`jobs.pooling.on_connection_created`); DATABASE_JIT=1
# keeps the server's setting. Behind a transaction-mode pooler a session
# setting would reach other clients: set jit = off on the role or database
# there.
DATABASE_JIT = env.bool("DATABASE_JIT", default=False)
if ASGI_SERVED and _postgres:
    # psycopg's pool, per web process: a request takes a connection already
    # open instead of connecting (which cost half the API's requests/s).
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2, "max_size": env.int("WEB_DATABASE_POOL_SIZE", default=4)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Claims take the write lock up front (BEGIN IMMEDIATE) so two workers
    # never both read a job as eligible; WAL lets readers proceed meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": env.float("SQLITE_BUSY_TIMEOUT", default=30.0),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file, not memory, so worker subprocesses started by tests share it.
    DATABASES["default"].setdefault("TEST", {})["NAME"] = env(
        "SQLITE_TEST_DATABASE", default=str(BASE_DIR / "test_db.sqlite3")
    )

# Reads on a standby (durable.replica): the pages people read and the API's
# GETs read the work's records there; writes, decisions and who may do what
# stay on the primary. A PostgreSQL streaming standby of DATABASE_URL's
# database, with the same connection settings as the primary.
DATABASE_REPLICA_URL = env("DATABASE_REPLICA_URL", default="").strip()
if DATABASE_REPLICA_URL:
    if not _postgres or urlsplit(DATABASE_REPLICA_URL).scheme not in ("postgres", "postgresql"):
        # The scheme only: the URL may carry a password, and this is logged.
        raise environ.ImproperlyConfigured(
            f"DATABASE_REPLICA_URL must be a postgres:// URL of a standby of DATABASE_URL's PostgreSQL database, "
            f"not a {urlsplit(DATABASE_REPLICA_URL).scheme or 'scheme-less'!r} URL")
    _replica = env.db_url_config(DATABASE_REPLICA_URL)
    DATABASES["replica"] = {
        **{k: v for k, v in DATABASES["default"].items() if k not in ("TEST",)}, **_replica,
        "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), **_replica.get("OPTIONS", {})},
        # Tests see the primary's test database under this alias.
        "TEST": {"MIRROR": "default"},
    }
    DATABASE_ROUTERS = ["durable.replica.ReplicaRouter"]
    MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.sessions.middleware.SessionMiddleware"),
                      "durable.replica.ReplicaReadsMiddleware")
    TEMPLATES[0]["OPTIONS"]["context_processors"].append("durable.replica.replica_status")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise serves STATIC_ROOT (filled by `collectstatic`, required when
# DURABLE_PRODUCTION=1, with compressed, content-hashed names). Outside
# production it serves straight from the apps' static folders, so
# `make demo`'s server shows a styled admin without a collectstatic step.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=not PRODUCTION)
if WHITENOISE_USE_FINDERS and not STATIC_ROOT.is_dir():
    STATIC_ROOT = None  # nothing collected: served from the finders alone (WhiteNoise would warn)
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# Which tenants a user may see in the console and the role held in each
# (DESIGN §14): one function, asked by every admin page and decision.
DURABLE_TENANT_SCOPE = env("DURABLE_TENANT_SCOPE", default="company.scope.tenant_scope")

# The outside world (DESIGN §6, §10).
PROVIDER_URL = env("PROVIDER_URL", default="http://127.0.0.1:8025")
PROVIDER_CONNECT_TIMEOUT = env.float("PROVIDER_CONNECT_TIMEOUT", default=2.0)
PROVIDER_READ_TIMEOUT = env.float("PROVIDER_READ_TIMEOUT", default=5.0)
# The whole exchange (default: connect + 2 × read) and the largest answer read.
PROVIDER_TOTAL_TIMEOUT = env.float("PROVIDER_TOTAL_TIMEOUT", default=None)
PROVIDER_MAX_RESPONSE_BYTES = env.int("PROVIDER_MAX_RESPONSE_BYTES", default=1024 * 1024)
if PRODUCTION:
    # The connector reads PROVIDER_API_KEY from the environment; in
    # production there is no development default to fall back to.
    if not env("PROVIDER_API_KEY", default=""):
        raise environ.ImproperlyConfigured("PROVIDER_API_KEY must be set when DURABLE_PRODUCTION=1")
    if urlsplit(PROVIDER_URL).scheme != "https":
        # The scheme only: the URL may carry credentials, and this is logged.
        raise environ.ImproperlyConfigured(
            f"PROVIDER_URL must be an https URL when DURABLE_PRODUCTION=1 (the API key travels with every "
            f"request), not a {urlsplit(PROVIDER_URL).scheme or 'scheme-less'!r} URL"
        )

# Inbound webhooks (DESIGN §7): per-provider HMAC-SHA256 secrets, e.g.
# INBOUND_WEBHOOK_SECRETS="sim=abc123,mailer=def456"; requests older than the
# allowed clock skew are refused.
INBOUND_WEBHOOK_SECRETS = env.dict("INBOUND_WEBHOOK_SECRETS", default={})
INBOUND_MAX_SKEW_SECONDS = env.int("INBOUND_MAX_SKEW_SECONDS", default=300)
# Which tenants each provider may act for (contract C3), e.g.
# INBOUND_PROVIDER_TENANTS="sim=demo|studio,mailer=*" ("*" = any tenant). A
# provider with a secret but no entry here may act for no tenant.
INBOUND_PROVIDER_TENANTS = {
    provider: [tenant for tenant in tenants.split("|") if tenant]
    for provider, tenants in env.dict("INBOUND_PROVIDER_TENANTS", default={}).items()
}

# Tenant fairness (DESIGN §5): at most this many concurrent leases per tenant
# (0 = no cap); tenants are served least-loaded first either way.
JOBS_TENANT_LEASE_CAP = env.int("JOBS_TENANT_LEASE_CAP", default=0)

# The largest job payload `enqueue` accepts, as JSON bytes (jobs.validation).
JOBS_MAX_PAYLOAD_BYTES = env.int("JOBS_MAX_PAYLOAD_BYTES", default=256 * 1024)

# Outbox deliveries before a failing event is quarantined (DESIGN §7).
OUTBOX_MAX_ATTEMPTS = env.int("OUTBOX_MAX_ATTEMPTS", default=10)

# Where the console is reached from a reviewer's mailbox: the links in the
# reviewers' digest and overdue emails (company.review_notify) start with it.
CONSOLE_BASE_URL = env("CONSOLE_BASE_URL", default="http://localhost:8000")

# The provider `connectors.send_email` uses when a payload names none.
OPERATIONS_DEFAULT_EMAIL_PROVIDER = env("OPERATIONS_DEFAULT_EMAIL_PROVIDER", default="sim-idempotent")

# Providers that can look a message up but not deduplicate by key: the first
# send of each intent is preceded by a lookup of its key, so a send repeated
# after the database lost a commit finds the first message instead of
# sending a second (docs/howto/failover.md). One more request per email.
OPERATIONS_LOOKUP_BEFORE_FIRST_SEND = env.list("OPERATIONS_LOOKUP_BEFORE_FIRST_SEND", default=[])

# The inbound provider whose signed events carry customers' replies to quotes;
# only its events may end a quote's wait (it needs a secret in
# INBOUND_WEBHOOK_SECRETS and the tenant in INBOUND_PROVIDER_TENANTS).
COMPANY_REPLY_PROVIDER = env("COMPANY_REPLY_PROVIDER", default="mailer")

# Effect limits and pauses (operations.limits): a job held by a pause checks
# again this often by itself (lifting the pause resumes it at once).
OPERATIONS_HOLD_RECHECK_SECONDS = env.float("OPERATIONS_HOLD_RECHECK_SECONDS", default=300.0)

# ---------------------------------------------------------------- the agent gateway (DESIGN §15)
# Proposals an agent may make per minute and per rolling 24 h (an agent's own
# limits override these), and the largest request body the API reads.
GATEWAY_PROPOSALS_PER_MINUTE = env.int("GATEWAY_PROPOSALS_PER_MINUTE", default=60)
GATEWAY_PROPOSALS_PER_DAY = env.int("GATEWAY_PROPOSALS_PER_DAY", default=5000)
GATEWAY_MAX_BODY_BYTES = env.int("GATEWAY_MAX_BODY_BYTES", default=512 * 1024)
# Callback URLs are requests made on an agent's behalf from inside our
# network: https only in production, and never to loopback, private,
# link-local (metadata) or other non-public addresses — checked on the
# resolved address at each delivery — unless allowed here for development.
GATEWAY_CALLBACK_REQUIRE_HTTPS = env.bool("GATEWAY_CALLBACK_REQUIRE_HTTPS", default=PRODUCTION)
GATEWAY_CALLBACK_ALLOW_PRIVATE = env.bool("GATEWAY_CALLBACK_ALLOW_PRIVATE", default=False)
if PRODUCTION and GATEWAY_CALLBACK_ALLOW_PRIVATE:
    raise environ.ImproperlyConfigured(
        "GATEWAY_CALLBACK_ALLOW_PRIVATE=1 is refused when DURABLE_PRODUCTION=1: agents could reach internal addresses"
    )
GATEWAY_CALLBACK_CONNECT_TIMEOUT = env.float("GATEWAY_CALLBACK_CONNECT_TIMEOUT", default=2.0)
GATEWAY_CALLBACK_READ_TIMEOUT = env.float("GATEWAY_CALLBACK_READ_TIMEOUT", default=5.0)

# ---------------------------------------------------------------- ecosystem (DESIGN §13)
# django-q2 is the calendar, never the executor: a schedule only creates
# durable obligations (or runs a bounded sweep) under business keys, so a
# repeated or late trigger is harmless; leases, fencing and retries belong to
# run_worker. Hence: the ORM broker on our own database (no extra service),
# catch_up=False (after downtime a schedule fires once, not once per missed
# slot), max_attempts=1 and ack_failures=True (django-q2 never re-runs a
# failed trigger; our engine owns retries), and timeout well under retry (a
# trigger still running is never handed to a second cluster worker).
Q_CLUSTER = {
    "name": "durable-calendar",
    "orm": "default",
    "workers": 1,
    "timeout": env.int("Q_CLUSTER_TIMEOUT", default=300),
    "retry": env.int("Q_CLUSTER_RETRY", default=900),
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 250,
}
# The only functions a Schedule may run (validated on save and again when the
# schedule fires), and the schedules `manage.py install_schedules` creates.
DURABLE_SCHEDULES = {
    # name: (function, django-q2 schedule type D=daily / H=hourly, first run at HH:MM UTC, what it does)
    "invoice-reminder-plan": ("company.schedules.plan_invoice_reminders", "D", "00:05",
                              "enqueue one reminder-planning job per tenant for the day"),
    # Hourly: each run stays under Q_CLUSTER_TIMEOUT, and at 100M jobs a
    # month a day's finished work needs more than one such run.
    "retention-sweep": ("jobs.schedules.retention_sweep", "H", "00:30",
                        "delete, then redact, finished work past its retention (within the task timeout)"),
    "consistency-audit": ("jobs.schedules.consistency_audit", "H", "00:15",
                          "file NEEDS_ATTENTION items for what no machine will fix"),
}
# Retention (jobs.retention): DONE/CANCELLED jobs finished longer ago than
# this are deleted with their history, operations and receipts; their payload
# and request bodies are redacted after the second, shorter period.
JOBS_RETENTION_DAYS = env.int("JOBS_RETENTION_DAYS", default=30)
JOBS_REDACT_AFTER_DAYS = env.int("JOBS_REDACT_AFTER_DAYS", default=7)
# A sweep's first batch; later ones are sized to take about
# JOBS_RETENTION_BATCH_SECONDS each (short transactions), and after each the
# sweep pauses JOBS_RETENTION_PAUSE_RATIO times as long as the batch took, so
# the workers keep most of the database while it runs (a larger ratio
# leaves them more; `manage.py bench_retention` measures it). A sweep ends
# when the work runs out or after JOBS_RETENTION_BUDGET_SECONDS (0: no
# limit; the scheduled sweep also stays under Q_CLUSTER_TIMEOUT).
JOBS_RETENTION_BATCH = env.int("JOBS_RETENTION_BATCH", default=500)
JOBS_RETENTION_BATCH_SECONDS = env.float("JOBS_RETENTION_BATCH_SECONDS", default=0.25)
JOBS_RETENTION_PAUSE_RATIO = env.float("JOBS_RETENTION_PAUSE_RATIO", default=3.0)
JOBS_RETENTION_BUDGET_SECONDS = env.float("JOBS_RETENTION_BUDGET_SECONDS", default=0)
# PostgreSQL's day partitions of the job history (jobs.partitions) are
# created this many days ahead by the sweep.
JOBS_HISTORY_PARTITIONS_AHEAD = env.int("JOBS_HISTORY_PARTITIONS_AHEAD", default=7)
# Consistency audit (jobs.audit): how old a condition must be to be filed.
AUDIT_STALE_LEASE_SECONDS = env.int("AUDIT_STALE_LEASE_SECONDS", default=900)
AUDIT_TIMER_OVERDUE_SECONDS = env.int("AUDIT_TIMER_OVERDUE_SECONDS", default=3600)
# Django tasks API (`@task` functions run as durable jobs).
TASKS = {"default": {"BACKEND": "jobs.tasks_backend.DurableBackend",
                     "QUEUES": env.list("TASKS_QUEUES", default=["default"])}}
# GET /metrics: a staff session or `Authorization: Bearer $METRICS_TOKEN`.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
# GET /readyz answers 503 past these (seconds).
READYZ_MAX_OUTBOX_LAG_SECONDS = env.float("READYZ_MAX_OUTBOX_LAG_SECONDS", default=300.0)
READYZ_MAX_READY_AGE_SECONDS = env.float("READYZ_MAX_READY_AGE_SECONDS", default=600.0)
READYZ_MAX_TIMER_OVERDUE_SECONDS = env.float("READYZ_MAX_TIMER_OVERDUE_SECONDS", default=600.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "jobs.logformat.LogFormatter", "fmt": "text"},
        "json": {"()": "jobs.logformat.LogFormatter", "fmt": "json"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": env("LOG_FORMAT", default="text")}},
    "loggers": {
        "jobs": {"handlers": ["console"], "level": env("JOBS_LOG_LEVEL", default="INFO")},
        # The Django tasks API's lines (a task started, finished; a failure with
        # its traceback, which error monitoring hooks), as django-tasks writes them.
        "django_tasks": {"handlers": ["console"], "level": env("TASKS_LOG_LEVEL", default="INFO")},
        # Server errors (a 500) with their traceback; not propagated, so not twice.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
