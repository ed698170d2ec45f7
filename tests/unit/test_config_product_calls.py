"""Runtime-file settings for product calls: callTimeoutSeconds, trustedRootCertificateRef,
clientAssertionAudience, and the TLS contexts built from them (CONTRACT §5, §9.3)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.codes import Code
from core.config import check_runtime_file, load_runtime_file
from core.config.model import Connection
from core.products.tls import connection_ssl_context, product_ssl_context
from core.secrets import SecretError, SecretRef, SecretResolver
from devstack.postgres_tls import LOOPBACK, CertificateAuthority
from tests.helpers.runtime_files import (
    Mutation,
    assert_refused_at,
    both,
    complete_runtime,
    put,
    refusal,
    secret_refs,
    write_runtime,
)

AUTHENTICATION = ("deployment", "authentication")


def _load(tmp_path: Path, *mutations: Mutation) -> Any:
    document = complete_runtime(tmp_path)
    for mutation in mutations:
        mutation(document, tmp_path)
    return check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document)).config


# -- defaults and accepted values -----------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = _load(tmp_path)
    for connection in config.connections.values():
        assert connection.call_timeout_seconds == 30
        assert connection.trusted_root_certificate_ref is None
    assert config.deployment.authentication.client_assertion_audience == "token-endpoint"
    paths = [path for path, _ in secret_refs(config)]
    assert not [p for p in paths if p.startswith("connections.") and "RootCertificate" in p]


def test_records_built_directly_keep_the_defaults() -> None:
    # Code that builds the records itself (tests, tools) need not name the new fields.
    from core.config.model import ConnectionAuthorization

    connection = Connection(
        name="notices",
        type="messaging",
        base_url="https://messaging.example.org",
        profile="p",
        authorization=ConnectionAuthorization("c", SecretRef("file", "k"), ("s",), None),
        producer=None,
        completion=None,
        result_check_seconds=None,
    )
    assert connection.call_timeout_seconds == 30
    assert connection.trusted_root_certificate_ref is None


@pytest.mark.parametrize("seconds", [1, 30, 300])
@pytest.mark.parametrize("name", ["notices", "review"])
def test_call_timeout_accepted(tmp_path: Path, name: str, seconds: int) -> None:
    config = _load(tmp_path, put(("connections", name, "callTimeoutSeconds"), seconds))
    assert config.connections[name].call_timeout_seconds == seconds
    others = [c for n, c in config.connections.items() if n != name]
    assert all(c.call_timeout_seconds == 30 for c in others)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("secret:file/products-ca.pem", SecretRef("file", "products-ca.pem")),
        ("secret:env/PRODUCTS_CA", SecretRef("env", "PRODUCTS_CA")),
    ],
)
def test_trusted_root_accepted_and_listed(
    tmp_path: Path, written: str, expected: SecretRef
) -> None:
    config = _load(tmp_path, put(("connections", "slots", "trustedRootCertificateRef"), written))
    assert config.connections["slots"].trusted_root_certificate_ref == expected
    assert config.connections["notices"].trusted_root_certificate_ref is None
    refs = secret_refs(config)
    assert ("connections.slots.trustedRootCertificateRef", expected) in refs
    paths = [path for path, _ in refs]
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize("value", ["token-endpoint", "issuer"])
def test_client_assertion_audience_accepted(tmp_path: Path, value: str) -> None:
    config = _load(tmp_path, put((*AUTHENTICATION, "clientAssertionAudience"), value))
    assert config.deployment.authentication.client_assertion_audience == value


def test_check_never_reads_the_product_root(tmp_path: Path) -> None:
    # The secret root does not exist at all: check passes on the reference alone.
    config = _load(
        tmp_path,
        put(("connections", "review", "trustedRootCertificateRef"), "secret:file/products-ca.pem"),
        put(("connections", "notices", "trustedRootCertificateRef"), "secret:env/NOT_SET_ANYWHERE"),
    )
    assert not (tmp_path / "secrets").exists()
    assert config.connections["review"].trusted_root_certificate_ref == SecretRef(
        "file", "products-ca.pem"
    )


def test_check_passes_with_an_unreadable_secret_root(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o000)
    try:
        config = _load(
            tmp_path,
            put(("connections", "review", "trustedRootCertificateRef"), "secret:file/ca.pem"),
        )
    finally:
        secrets.chmod(0o700)
    assert config.connections["review"].trusted_root_certificate_ref is not None


# -- refusals ----------------------------------------------------------------------------------

_ENV_ONLY_FOR_ROOT = both(
    put(("database", "migrationUrlRef"), "secret:file/migration-db-url"),
    put(("secretProviders",), {"file": {"root": "secrets"}}),
    put(("connections", "notices", "trustedRootCertificateRef"), "secret:env/PRODUCTS_CA"),
)

PRODUCT_CALL_CASES: list[pytest.ParameterSet] = [
    refusal("timeout-zero", put(("connections", "notices", "callTimeoutSeconds"), 0)),
    refusal("timeout-negative", put(("connections", "notices", "callTimeoutSeconds"), -5)),
    refusal("timeout-high", put(("connections", "review", "callTimeoutSeconds"), 301)),
    refusal("timeout-float", put(("connections", "slots", "callTimeoutSeconds"), 30.0)),
    refusal("timeout-string", put(("connections", "register", "callTimeoutSeconds"), "30")),
    refusal("timeout-bool", put(("connections", "notices", "callTimeoutSeconds"), True)),
    refusal("timeout-null", put(("connections", "notices", "callTimeoutSeconds"), None)),
    refusal(
        "root-plain-path",
        put(("connections", "notices", "trustedRootCertificateRef"), "/etc/ssl/ca.pem"),
    ),
    refusal(
        "root-traversal",
        put(("connections", "notices", "trustedRootCertificateRef"), "secret:file/../ca.pem"),
    ),
    refusal(
        "root-unknown-provider",
        put(("connections", "notices", "trustedRootCertificateRef"), "secret:vault/ca"),
    ),
    refusal(
        "root-not-a-string",
        put(("connections", "notices", "trustedRootCertificateRef"), {"file": "ca.pem"}),
    ),
    refusal(
        "root-env-provider-disabled",
        _ENV_ONLY_FOR_ROOT,
        at="connections.notices.trustedRootCertificateRef",
    ),
    refusal("assertion-audience-other", put((*AUTHENTICATION, "clientAssertionAudience"), "both")),
    refusal("assertion-audience-case", put((*AUTHENTICATION, "clientAssertionAudience"), "Issuer")),
    refusal(
        "assertion-audience-url",
        put((*AUTHENTICATION, "clientAssertionAudience"), "https://issuer.example.org"),
    ),
    refusal("assertion-audience-empty", put((*AUTHENTICATION, "clientAssertionAudience"), "")),
    refusal("assertion-audience-null", put((*AUTHENTICATION, "clientAssertionAudience"), None)),
    refusal(
        "assertion-audience-list", put((*AUTHENTICATION, "clientAssertionAudience"), ["issuer"])
    ),
    # unknown keys are still refused next to the new ones
    refusal("unknown-connection-key", put(("connections", "notices", "callTimeout"), 30)),
    refusal(
        "unknown-root-spelling",
        put(("connections", "notices", "trustedRootCertificate"), "secret:file/ca.pem"),
    ),
    refusal(
        "timeout-under-authorization",
        put(("connections", "notices", "authorization", "callTimeoutSeconds"), 30),
    ),
    refusal("unknown-authentication-key", put((*AUTHENTICATION, "assertionAudience"), "issuer")),
]


@pytest.mark.parametrize(("mutation", "path"), PRODUCT_CALL_CASES)
def test_each_refusal_names_its_key_path(tmp_path: Path, mutation: Mutation, path: str) -> None:
    assert_refused_at(tmp_path, mutation, path)


def test_loading_alone_refuses_too(tmp_path: Path) -> None:
    # The loader (not only the packaged check) judges the new keys.
    document = complete_runtime(tmp_path)
    document["connections"]["notices"]["callTimeoutSeconds"] = 301
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    from core.errors import ConfigInvalid

    with pytest.raises(ConfigInvalid) as caught:
        load_runtime_file(runtime)
    assert caught.value.path == "connections.notices.callTimeoutSeconds"
    assert caught.value.reason == "must be between 1 and 300"


# -- TLS contexts for product calls ------------------------------------------------------------


class TlsServer:
    """A TLS server on 127.0.0.1 that answers every connection with ``hello`` and closes."""

    def __init__(self, tmp_path: Path, authority: CertificateAuthority, hosts: tuple[str, ...]):
        cert_pem, key_pem = authority.issue_server(hosts)
        cert, key = tmp_path / f"{hosts[0]}.crt", tmp_path / f"{hosts[0]}.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        key.chmod(0o600)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> TlsServer:
        self.server = await asyncio.start_server(self._answer, LOOPBACK, 0, ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @staticmethod
    async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        try:
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()

    async def exchange(self, context: ssl.SSLContext, host: str = LOOPBACK) -> bytes:
        """Connect with ``context`` (verifying ``host``), read the greeting, close."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, self.port, ssl=context, server_hostname=host), 10
        )
        try:
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()


@pytest.fixture(scope="module")
def product_ca() -> CertificateAuthority:
    return CertificateAuthority.create("Products test CA")


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    return CertificateAuthority.create("Some other CA")


@pytest.fixture
async def product(tmp_path: Path, product_ca: CertificateAuthority) -> AsyncIterator[TlsServer]:
    async with TlsServer(tmp_path, product_ca, ("localhost", LOOPBACK)) as server:
        yield server


def test_context_settings(product_ca: CertificateAuthority) -> None:
    for context in (product_ssl_context(None), product_ssl_context(product_ca.pem)):
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname is True
        assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    private = product_ssl_context(product_ca.pem)
    # Only the given root: no system root is loaded beside it.
    assert private.cert_store_stats()["x509_ca"] == 1


async def test_given_root_is_trusted(product: TlsServer, product_ca: CertificateAuthority) -> None:
    context = product_ssl_context(product_ca.pem)
    assert await product.exchange(context) == b"hello"
    assert await product.exchange(context, host="localhost") == b"hello"


async def test_several_roots_in_one_pem(
    product: TlsServer, product_ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    context = product_ssl_context(other_ca.pem + product_ca.pem)
    assert await product.exchange(context) == b"hello"


async def test_certificate_of_another_root_is_refused(
    product: TlsServer, other_ca: CertificateAuthority
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await product.exchange(product_ssl_context(other_ca.pem))


async def test_system_roots_do_not_vouch_for_a_private_root(product: TlsServer) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await product.exchange(product_ssl_context(None))


async def test_host_name_is_checked(tmp_path: Path, product_ca: CertificateAuthority) -> None:
    async with TlsServer(tmp_path, product_ca, ("products.example.org",)) as elsewhere:
        with pytest.raises(ssl.SSLCertVerificationError):
            await elsewhere.exchange(product_ssl_context(product_ca.pem))


@pytest.mark.parametrize(
    "pem",
    [
        pytest.param(b"not a certificate", id="text"),
        pytest.param(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", id="bad"),
        pytest.param("café".encode(), id="non-ascii"),
        pytest.param(b"\x30\x82\x01\x00", id="der-bytes"),
    ],
)
def test_unloadable_pem_is_refused(pem: bytes) -> None:
    with pytest.raises(ValueError) as caught:
        product_ssl_context(pem)
    assert pem.decode("latin-1") not in str(caught.value)


# -- connection_ssl_context: the root read through the secret resolver -------------------------


def _connection(tmp_path: Path, ref: str | None) -> tuple[Connection, SecretResolver]:
    mutations: list[Mutation] = []
    if ref is not None:
        mutations.append(put(("connections", "notices", "trustedRootCertificateRef"), ref))
    config = _load(tmp_path, *mutations)
    root = tmp_path / "secrets"
    root.mkdir(mode=0o700, exist_ok=True)
    return config.connections["notices"], SecretResolver(file_root=root, environment=False)


def _write_secret(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / "secrets" / name
    path.write_bytes(data)
    path.chmod(0o600)


async def test_connection_context_uses_the_configured_root(
    tmp_path: Path, product: TlsServer, product_ca: CertificateAuthority
) -> None:
    connection, resolver = _connection(tmp_path, "secret:file/products-ca.pem")
    _write_secret(tmp_path, "products-ca.pem", product_ca.pem)
    assert await product.exchange(connection_ssl_context(connection, resolver)) == b"hello"


async def test_connection_root_from_the_environment_is_pem_text(
    tmp_path: Path, product: TlsServer, product_ca: CertificateAuthority
) -> None:
    connection, _ = _connection(tmp_path, "secret:env/PRODUCTS_CA")
    resolver = SecretResolver(
        file_root=None, environment=True, environ={"PRODUCTS_CA": product_ca.pem.decode()}
    )
    assert await product.exchange(connection_ssl_context(connection, resolver)) == b"hello"


async def test_connection_context_without_a_root_uses_the_system_roots(
    tmp_path: Path, product: TlsServer
) -> None:
    connection, resolver = _connection(tmp_path, None)
    context = connection_ssl_context(connection, resolver)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    with pytest.raises(ssl.SSLCertVerificationError):
        await product.exchange(context)


def test_connection_root_that_does_not_load_names_the_key_path(tmp_path: Path) -> None:
    connection, resolver = _connection(tmp_path, "secret:file/products-ca.pem")
    content = b"-----BEGIN CERTIFICATE-----\nc2VjcmV0LWxvb2tpbmc=\n-----END CERTIFICATE-----\n"
    _write_secret(tmp_path, "products-ca.pem", content)
    with pytest.raises(SecretError) as caught:
        connection_ssl_context(connection, resolver)
    assert caught.value.code == Code.SECRET_MALFORMED
    assert "connections.notices.trustedRootCertificateRef" in caught.value.detail
    assert "secret:file/products-ca.pem" in caught.value.detail
    assert "c2VjcmV0LWxvb2tpbmc" not in str(caught.value)


def test_connection_root_missing_is_unreadable(tmp_path: Path) -> None:
    connection, resolver = _connection(tmp_path, "secret:file/products-ca.pem")
    with pytest.raises(SecretError) as caught:
        connection_ssl_context(connection, resolver)
    assert caught.value.code == Code.SECRET_UNREADABLE
