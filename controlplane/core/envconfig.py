"""Strict parsing of settings from the environment.

Every helper takes the environment as a mapping so it can be tested without touching
``os.environ``. A bad value raises :class:`ConfigError` naming the variable, what was
found and what is accepted: a control plane that starts with a silently wrong setting is
worse than one that refuses to start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A setting from the environment is malformed or out of range."""


def read_secret(env: Mapping[str, str], name: str) -> str | None:
    """``NAME`` or the contents of the file named by ``NAME_FILE`` (Docker secrets)."""
    direct = env.get(name)
    from_file = env.get(f"{name}_FILE")
    if direct is not None and from_file is not None:
        raise ConfigError(f"{name} and {name}_FILE are both set; set only one")
    if from_file is not None:
        try:
            return Path(from_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={from_file!r} cannot be read: {exc}") from exc
    return direct


def env_str(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    if value is None:
        return default
    value = value.strip()
    if not value:
        raise ConfigError(f"{name} is set but empty; unset it to use the default")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a boolean; use one of "
        f"{sorted(TRUE_WORDS)} or {sorted(FALSE_WORDS)}"
    )


def env_int(
    env: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is above the maximum {maximum}")
    return value


def env_float(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={raw!r} must be a finite number")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is above the maximum {maximum}")
    return value


def env_list(env: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    raw = env.get(name)
    if raw is None:
        return list(default)
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ConfigError(f"{name}={raw!r} has an empty item; use a comma-separated list")
    return items


DATABASE_SCHEMES = {"postgres", "postgresql", "pgsql", "sqlite"}
REDIS_SCHEMES = {"redis", "rediss", "unix"}


def env_url(
    env: Mapping[str, str], name: str, schemes: set[str], default: str | None = None
) -> str | None:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip()
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ConfigError(
            f"{name}={value!r} has scheme {parts.scheme!r}; expected one of {sorted(schemes)}"
        )
    if parts.scheme not in {"sqlite", "unix"} and not parts.hostname:
        raise ConfigError(f"{name}={value!r} has no host")
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"{name}={value!r} has no socket path")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ConfigError(f"{name}={value!r} has an invalid port") from None
    return value


def celery_broker_url(redis_url: str) -> str:
    """kombu spells a Redis unix socket ``redis+socket://``; redis-py spells it ``unix://``."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url[len("unix://") :]
    return redis_url
