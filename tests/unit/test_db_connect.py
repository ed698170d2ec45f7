"""URL and TLS handling of core.db.connect, without a server."""

from __future__ import annotations

import importlib
import ssl
from typing import Any

import asyncpg
import pytest

from core.db.connect import (
    DatabaseHost,
    client_ssl_context,
    connect,
    create_pool,
    parse_database_url,
    quote_ident,
    require_server_version,
    serving_host,
)
from core.errors import CoordinatorError
from devstack.postgres import make_password, postgres_url
from devstack.postgres_tls import CertificateAuthority

# (core.db re-exports the function connect under the module's own name)
connect_module = importlib.import_module("core.db.connect")

SECRET = "s3cr@t:/?#%&pw"
ENCODED = "s3cr%40t%3A%2F%3F%23%25%26pw"


def url(query: str = "sslmode=verify-full", host: str = "db.example.org:6543") -> str:
    return f"postgresql://app%20user:{ENCODED}@{host}/coordinator%2Dprod?{query}"


def refusal(text: str, **kwargs: Any) -> CoordinatorError:
    with pytest.raises(CoordinatorError) as caught:
        parse_database_url(text, **kwargs)
    error = caught.value
    assert error.code == "deployment.refused"
    # Neither the URL, nor the password (raw or encoded), nor a chained driver message.
    for leak in (text, SECRET, ENCODED, "s3cr"):
        assert leak not in str(error)
    assert error.__cause__ is None
    return error


def test_parts_are_percent_decoded() -> None:
    parsed = parse_database_url(url())
    assert (parsed.host, parsed.port, parsed.user, parsed.database, parsed.sslmode) == (
        "db.example.org",
        6543,
        "app user",
        "coordinator-prod",
        "verify-full",
    )
    assert parsed.password == SECRET
    assert SECRET not in repr(parsed)


@pytest.mark.parametrize("mode", ["require", "verify-ca", "verify-full"])
def test_tls_modes_are_accepted(mode: str) -> None:
    assert parse_database_url(url(f"sslmode={mode}")).sslmode == mode


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "VERIFY-FULL", "", "bogus"])
def test_weaker_or_unknown_modes_are_refused(mode: str) -> None:
    error = refusal(url(f"sslmode={mode}"))
    assert "sslmode" in error.detail


def test_missing_sslmode_is_refused_and_named() -> None:
    error = refusal(url(""), label="database.runtimeUrlRef")
    assert error.detail.startswith("database.runtimeUrlRef: sslmode is missing")


def test_repeated_sslmode_is_refused() -> None:
    assert "more than once" in refusal(url("sslmode=require&sslmode=disable")).detail


def test_unknown_parameter_is_named_but_not_its_value() -> None:
    error = refusal(url(f"sslmode=require&sslrootcert={ENCODED}"))
    assert "sslrootcert" in error.detail


def test_unencoded_hash_in_password_is_explained() -> None:
    error = refusal("postgresql://u:pa#ss@h:5432/d?sslmode=require")
    assert "%23" in error.detail


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://u:{ENCODED}@h:notaport/d?sslmode=require",
        f"postgresql://u:{ENCODED}@h:99999/d?sslmode=require",
        f"postgresql://u:{ENCODED}@[::1/d?sslmode=require",
    ],
)
def test_unreadable_host_or_port_hides_the_driver_message(text: str) -> None:
    refusal(text)


@pytest.mark.parametrize(
    ("text", "word"),
    [
        (f"mysql://u:{ENCODED}@h/d?sslmode=require", "postgresql://"),
        (f"postgresql://u:{ENCODED}@/d?sslmode=require&host=%2Ftmp", "host"),
        (f"postgresql://u:{ENCODED}@h1:5432,:5433/d?sslmode=require", "no host"),
        (f"postgresql://u:{ENCODED}@h1:5432,h2:x/d?sslmode=require", "host or port"),
        (
            f"postgresql://u:{ENCODED}@h1,h2/d?sslmode=require&target_session_attrs=any",
            "target_session_attrs must be read-write",
        ),
        ("postgresql://h/d?sslmode=require", "no user"),
        (f"postgresql://u:{ENCODED}@h/a/b?sslmode=require", "single database"),
        (f"postgresql://u:{ENCODED}@h/d?sslmode=require&connect_timeout=x", "connect_timeout"),
        (f"postgresql://u:{ENCODED}@h/d?sslmode=require&connect_timeout=0", "connect_timeout"),
    ],
)
def test_malformed_urls_are_refused(text: str, word: str) -> None:
    assert word in refusal(text).detail


def test_defaults_follow_libpq() -> None:
    parsed = parse_database_url("postgres://someone@[::1]?sslmode=require")
    assert (parsed.host, parsed.port, parsed.database, parsed.password) == (
        "::1",
        5432,
        "someone",
        None,
    )


def test_several_hosts_are_read_in_order_with_libpq_s_default_port() -> None:
    parsed = parse_database_url(
        f"postgresql://u:{ENCODED}@db-a:5433,db-b,[::1]:6000/d"
        "?sslmode=verify-full&target_session_attrs=read-write"
    )
    assert [str(host) for host in parsed.hosts] == ["db-a:5433", "db-b:5432", "[::1]:6000"]
    assert (parsed.host, parsed.port, parsed.password) == ("db-a", 5433, "s3cr@t:/?#%&pw")
    primary = parse_database_url(url("sslmode=require&target_session_attrs=primary"))
    assert len(primary.hosts) == 1


def test_options_are_read() -> None:
    parsed = parse_database_url(url("sslmode=require&application_name=admission&connect_timeout=3"))
    assert (parsed.application_name, parsed.connect_timeout) == ("admission", 3.0)


@pytest.mark.parametrize("length", [12, 32, 64])
def test_generated_passwords_survive_a_url_round_trip(length: int) -> None:
    password = make_password(length)
    assert len(password) == length
    assert sum(c in "@:/?#%&=+$,;[]!*'()~ " for c in password) >= 8
    text = postgres_url("coordinator_runtime", password, "127.0.0.1", 5432, "coordinator")
    parsed = parse_database_url(text)
    assert (parsed.password, parsed.user, parsed.host) == (
        password,
        "coordinator_runtime",
        "127.0.0.1",
    )


def test_context_always_checks_chain_and_host_name() -> None:
    for pem in (None, CertificateAuthority.create().pem):
        context = client_ssl_context(pem)
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname is True
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_private_root_replaces_system_roots() -> None:
    ca = CertificateAuthority.create("Only this one")
    roots = client_ssl_context(ca.pem).get_ca_certs()
    assert len(roots) == 1
    assert roots[0]["subject"] == ((("commonName", "Only this one"),),)


@pytest.mark.parametrize("pem", [b"not a certificate", "caf\u00e9".encode()])
def test_unreadable_root_is_refused(pem: bytes) -> None:
    with pytest.raises(CoordinatorError) as caught:
        client_ssl_context(pem, label="database.trustedRootCertificateRef")
    assert caught.value.code == "deployment.refused"
    assert caught.value.detail.startswith("database.trustedRootCertificateRef:")


async def test_connect_refuses_before_touching_the_network() -> None:
    # Port 9 on loopback has no server: reaching the network would raise OSError instead.
    with pytest.raises(CoordinatorError) as caught:
        await connect(f"postgresql://u:{ENCODED}@127.0.0.1:9/d", None)
    assert "sslmode" in caught.value.detail
    with pytest.raises(CoordinatorError):
        await create_pool(
            f"postgresql://u:{ENCODED}@127.0.0.1:9/d?sslmode=prefer", None, min_size=1, max_size=1
        )


def test_quote_ident() -> None:
    assert quote_ident("coordinator_runtime") == '"coordinator_runtime"'
    assert quote_ident('we"ird') == '"we""ird"'
    for bad in ("", "a\x00b"):
        with pytest.raises(ValueError):
            quote_ident(bad)


class _FakeConnection:
    def __init__(self, version: int) -> None:
        self.version = version
        self.queries: list[str] = []

    async def fetchval(self, query: str) -> int:
        self.queries.append(query)
        return self.version


async def test_version_17_and_newer_pass() -> None:
    for version in (170000, 170010, 180004):
        fake = _FakeConnection(version)
        assert await require_server_version(fake) == version
        assert "server_version_num" in fake.queries[0]


async def test_older_server_is_refused() -> None:
    with pytest.raises(CoordinatorError) as caught:
        await require_server_version(_FakeConnection(160004))
    assert caught.value.code == "deployment.refused"
    assert "17" in caught.value.detail


class _Reached:
    """Stands in for a connection: it only records where it was opened."""

    serving: DatabaseHost


def _network(answers: dict[str, BaseException | None]) -> Any:
    async def fake_connect(*, host: str, **_: Any) -> _Reached:
        failure = answers[host]
        if failure is not None:
            raise failure
        return _Reached()

    return fake_connect


HOSTS = (DatabaseHost("db-a", 5432), DatabaseHost("db-b", 5432), DatabaseHost("db-c", 5432))


async def test_hosts_are_tried_in_order_until_one_takes_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: dict[str, BaseException | None] = {
        "db-a": ConnectionRefusedError(),
        "db-b": asyncpg.TargetServerAttributeNotMatched("read-only"),
        "db-c": None,
    }
    monkeypatch.setattr(connect_module.asyncpg, "connect", _network(answers))
    conn = await connect_module._open(hosts=HOSTS)
    assert serving_host(conn) == HOSTS[2]


async def test_a_certificate_failure_is_not_hidden_behind_a_host_that_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: dict[str, BaseException | None] = {
        "db-a": ssl.SSLCertVerificationError("certificate verify failed"),
        "db-b": ConnectionRefusedError(),
        "db-c": TimeoutError(),
    }
    monkeypatch.setattr(connect_module.asyncpg, "connect", _network(answers))
    with pytest.raises(ssl.SSLCertVerificationError):
        await connect_module._open(hosts=HOSTS)
    answers["db-a"] = ConnectionRefusedError()
    with pytest.raises(TimeoutError):
        await connect_module._open(hosts=HOSTS)


async def test_a_refused_login_ends_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: dict[str, BaseException | None] = {
        "db-a": asyncpg.InvalidPasswordError("password authentication failed"),
        "db-b": None,
        "db-c": None,
    }
    monkeypatch.setattr(connect_module.asyncpg, "connect", _network(answers))
    with pytest.raises(asyncpg.InvalidPasswordError):
        await connect_module._open(hosts=HOSTS)
