import pytest

from controlplane.core import envconfig as ec


@pytest.mark.parametrize(
    "raw,expected", [("1", True), ("TRUE", True), ("off", False), ("0", False)]
)
def test_bool_words(raw, expected):
    assert ec.env_bool({"DEBUG": raw}, "DEBUG", not expected) is expected


def test_bool_rejects_anything_else():
    with pytest.raises(ec.ConfigError, match=r"DEBUG='maybe' is not a boolean"):
        ec.env_bool({"DEBUG": "maybe"}, "DEBUG", False)


def test_bool_default_when_unset():
    assert ec.env_bool({}, "DEBUG", True) is True


def test_int_range_and_garbage():
    assert ec.env_int({"N": " 7 "}, "N", 1, minimum=1) == 7
    with pytest.raises(ec.ConfigError, match="not an integer"):
        ec.env_int({"N": "seven"}, "N", 1)
    with pytest.raises(ec.ConfigError, match="below the minimum 1"):
        ec.env_int({"N": "0"}, "N", 1, minimum=1)
    with pytest.raises(ec.ConfigError, match="above the maximum 10"):
        ec.env_int({"N": "11"}, "N", 1, maximum=10)


def test_float_rejects_nan():
    with pytest.raises(ec.ConfigError, match="finite"):
        ec.env_float({"X": "nan"}, "X", 1.0)


def test_list_rejects_empty_items():
    assert ec.env_list({"H": "a.example, b.example"}, "H", []) == ["a.example", "b.example"]
    with pytest.raises(ec.ConfigError, match="empty item"):
        ec.env_list({"H": "a,,b"}, "H", [])


def test_empty_string_is_an_error_not_a_default():
    with pytest.raises(ec.ConfigError, match="set but empty"):
        ec.env_str({"S": "  "}, "S", "x")


@pytest.mark.parametrize(
    "url",
    ["postgres://u@db:5432/pdplane", "postgresql://db/pdplane", "sqlite:///tmp/x.sqlite3"],
)
def test_database_urls_accepted(url):
    assert ec.env_url({"DATABASE_URL": url}, "DATABASE_URL", ec.DATABASE_SCHEMES) == url


@pytest.mark.parametrize(
    "url,message",
    [
        ("mysql://db/x", "scheme 'mysql'"),
        ("postgres:///nohost", "has no host"),
        ("postgres://db:notaport/x", "invalid port"),
    ],
)
def test_database_urls_rejected(url, message):
    with pytest.raises(ec.ConfigError, match=message):
        ec.env_url({"DATABASE_URL": url}, "DATABASE_URL", ec.DATABASE_SCHEMES)


def test_redis_urls():
    assert ec.env_url({"R": "redis://127.0.0.1:6379/0"}, "R", ec.REDIS_SCHEMES)
    assert ec.env_url({"R": "unix:///tmp/r.sock"}, "R", ec.REDIS_SCHEMES)
    with pytest.raises(ec.ConfigError, match="scheme 'http'"):
        ec.env_url({"R": "http://x"}, "R", ec.REDIS_SCHEMES)


def test_celery_needs_socket_spelling_for_unix_redis():
    assert ec.celery_broker_url("unix:///v/redis.sock") == "redis+socket:///v/redis.sock"
    assert ec.celery_broker_url("redis://h:1/0") == "redis://h:1/0"


def test_secret_from_file(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    assert ec.read_secret({"SECRET_KEY_FILE": str(secret)}, "SECRET_KEY") == "s3cret"
    with pytest.raises(ec.ConfigError, match="both set"):
        ec.read_secret({"SECRET_KEY": "a", "SECRET_KEY_FILE": str(secret)}, "SECRET_KEY")
    with pytest.raises(ec.ConfigError, match="cannot be read"):
        ec.read_secret({"SECRET_KEY_FILE": str(tmp_path / "missing")}, "SECRET_KEY")
