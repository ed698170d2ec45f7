"""A real, certified OpenID provider for the tests: panva's ``oidc-provider`` on Node.js.

The package is pinned in ``devstack/oidc/package.json`` (one exact version) and
``devstack/oidc/package-lock.json`` (the whole tree, each package with its sha512
``integrity``). :func:`ensure_installed` installs exactly that tree with ``npm ci
--ignore-scripts`` into ``.cache/oidc-provider`` (``make oidc-provider`` runs it; npm checks
every tarball against the lock's integrity, and no package script runs). Nothing else is
fetched, then or later. The installing itself is :mod:`devstack.npm_tree`'s, shared with the
browser of the console's tests.

:class:`OidcProvider` runs ``devstack/oidc/provider.mjs`` with the machine's ``node`` on
127.0.0.1. The harness writes its settings as a JSON file in a private folder: the issuer
URL, the signing key (a private JWK the harness made, so tests can also sign with it), the
clients (``private_key_jwt`` with their public JWKs, or ``client_secret_basic``) and the
resources (RFC 8707): for each resource indicator, the token ``aud``, the scopes it grants
and the clients that may ask for it. Access tokens are RFC 9068 JWTs for a known resource;
a request without a resource gets an opaque token; an unknown resource, or one the client is
not registered for, gets ``invalid_target``. ``client_assertion_audience="issuer"`` runs the
provider's FAPI 2.0 profile, which accepts only the issuer identifier as the ``aud`` of a
client assertion.

Start-up is awaited on a pipe the provider writes ``ready`` into once it listens (no
polling), then the discovery document is read and must name the issuer. The provider exits
when the harness closes its standard input, so it never outlives the test process.

:class:`OidcProviders` starts several and stops them all (the ``oidc_providers`` fixture of
``tests/reliability``). :class:`ProviderStack` is a :class:`~devstack.stack.LocalStack`
whose issuer is such a provider instead of the development issuer; :func:`registrations`
derives the provider's clients and resources from a runtime file.

``python -m devstack.oidc_provider`` installs the pinned tree (``make oidc-provider``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from core.config.load import load_runtime_file
from core.keys import resolver_for
from devstack import npm_tree
from devstack.issuer import generate_private_jwk, public_jwk
from devstack.npm_tree import INSTALL_TIMEOUT_SECONDS as INSTALL_TIMEOUT_SECONDS
from devstack.npm_tree import MARKER_NAME as MARKER_NAME
from devstack.npm_tree import NpmTree
from devstack.postgres import DatabaseHandle
from devstack.stack import CONNECTION_MODULES, LocalStack, http_ok, wait_until

VERSION = "9.13.3"
"""The pinned ``oidc-provider`` version; ``devstack/oidc/package.json`` names exactly this."""
PACKAGE = "oidc-provider"
NODE_MAJOR_MINIMUM = 20
CACHE_ENV = "COORDINATOR_OIDC_PROVIDER_CACHE"
SOURCE_DIR = Path(__file__).resolve().parent / "oidc"
SCRIPT = SOURCE_DIR / "provider.mjs"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
ASSERTION_AUDIENCES = ("token-endpoint", "issuer")


class ProviderError(RuntimeError):
    """The provider could not be installed, started or asked (never carries a secret)."""


# --------------------------------------------------------------------------- installation

# The generic half (pins, cache folder, npm ci, flock) is devstack.npm_tree; these names stay
# for the tests and the Makefile.
TREE = NpmTree(
    package=PACKAGE,
    version=VERSION,
    source=SOURCE_DIR,
    default_cache_root=Path(__file__).resolve().parents[1] / ".cache" / "oidc-provider",
    cache_env=CACHE_ENV,
    error=ProviderError,
)


def default_cache_root() -> Path:
    """``.cache/oidc-provider`` in the checkout, or ``COORDINATOR_OIDC_PROVIDER_CACHE``."""
    return TREE.cache_root()


def lock_digest(source: Path = SOURCE_DIR) -> str:
    """SHA-256 over ``package.json`` and ``package-lock.json``: names one install."""
    return TREE.lock_digest(source)


def check_pins(source: Path = SOURCE_DIR) -> None:
    """Refuse unless ``package.json`` pins exactly :data:`VERSION` and the lock holds an
    integrity hash for every package it installs (so ``npm ci`` checks every tarball)."""
    TREE.check_pins(source)


def modules_dir(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> Path:
    """The ``node_modules`` folder of the install of ``source``'s lock."""
    return TREE.modules_dir(cache_root, source)


def is_installed(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> bool:
    """True when a finished install of exactly this lock is in the cache."""
    return TREE.is_installed(cache_root, source)


def ensure_installed(cache_root: Path | None = None, source: Path = SOURCE_DIR) -> Path:
    """Install the locked tree with ``npm ci`` if needed; return its ``node_modules``."""
    return TREE.ensure_installed(cache_root, source)


def find_node() -> str:
    """The machine's ``node``, refused when older than Node.js :data:`NODE_MAJOR_MINIMUM`."""
    return npm_tree.find_node(NODE_MAJOR_MINIMUM, ProviderError)


# --------------------------------------------------------------------------- registrations


@dataclass(frozen=True)
class Client:
    """One client of the provider: ``private_key_jwt`` with ``jwks``,
    ``client_secret_basic`` with ``secret``, or a ``public`` client of the device
    authorization grant (RFC 8628) that may also refresh its tokens."""

    client_id: str
    jwks: Mapping[str, Any] | None = None
    secret: str | None = field(default=None, repr=False)
    public: bool = False

    def __post_init__(self) -> None:
        if [self.jwks is not None, self.secret is not None, self.public].count(True) != 1:
            raise ValueError(
                f"client {self.client_id}: give exactly one of jwks, secret and public"
            )

    def to_json(self) -> dict[str, Any]:
        if self.public:
            return {"clientId": self.client_id, "auth": "none"}
        if self.jwks is not None:
            keys = [public_jwk(key) for key in self.jwks["keys"]]
            return {"clientId": self.client_id, "auth": "private_key_jwt", "jwks": {"keys": keys}}
        return {"clientId": self.client_id, "auth": "client_secret_basic", "secret": self.secret}


@dataclass(frozen=True)
class Resource:
    """One RFC 8707 resource: what a token for it says in ``aud``, which scopes it may
    carry, and which clients may ask for it."""

    resource: str
    audience: str
    scopes: tuple[str, ...]
    clients: tuple[str, ...]
    alg: str | None = None
    """The JWS algorithm of its tokens (a signing key for it must be given); the first
    signing key's when ``None``."""

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "resource": self.resource,
            "audience": self.audience,
            "scopes": list(self.scopes),
            "clients": list(self.clients),
        }
        if self.alg is not None:
            document["alg"] = self.alg
        return document


def registrations(
    runtime_file: Path, callers: Mapping[str, str]
) -> tuple[list[Client], list[Resource]]:
    """The provider's clients and resources for a runtime file.

    Each connection's client is registered with ``private_key_jwt`` and the public half of
    the key its ``signingKeyRef`` names, for one resource: the connection's token audience,
    with its scopes. ``callers`` (client id → secret) use ``client_secret_basic`` and may ask
    for the gateway's public URL (the ``authentication.audience``).
    """
    config = load_runtime_file(runtime_file)
    resolver = resolver_for(config)
    clients = [Client(client_id, secret=secret) for client_id, secret in callers.items()]
    audience = config.deployment.authentication.audience
    resources = [Resource(audience, audience, (), tuple(callers))]
    for connection in config.connections.values():
        authorization = connection.authorization
        private = resolver.read_jwk(authorization.signing_key_ref)
        clients.append(Client(authorization.client_id, jwks={"keys": [public_jwk(private)]}))
        resources.append(
            Resource(
                connection.token_audience,
                connection.token_audience,
                tuple(authorization.scopes),
                (authorization.client_id,),
            )
        )
    return clients, resources


# --------------------------------------------------------------------------- the provider


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, data)
    finally:
        os.close(descriptor)


class OidcProvider:
    """A running ``oidc-provider``. Use :meth:`start`; always :meth:`stop`."""

    def __init__(
        self,
        *,
        workdir: Path,
        issuer: str,
        clients: Sequence[Client],
        resources: Sequence[Resource],
        signing_jwks: Sequence[Mapping[str, Any]],
        client_assertion_audience: str,
        access_token_seconds: int,
        modules: Path,
    ) -> None:
        parts = urlsplit(issuer)
        if parts.scheme != "http" or parts.hostname != LOOPBACK or parts.port is None:
            raise ProviderError("the issuer must be http://127.0.0.1:<port>")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ProviderError("the issuer must be http://127.0.0.1:<port> without a path")
        if client_assertion_audience not in ASSERTION_AUDIENCES:
            raise ProviderError(f"client_assertion_audience must be one of {ASSERTION_AUDIENCES}")
        self.workdir = workdir
        self.issuer = issuer
        self.port = parts.port
        self.clients = tuple(clients)
        self.resources = tuple(resources)
        if not signing_jwks or any("kid" not in k or "alg" not in k for k in signing_jwks):
            raise ProviderError("each signing key needs a kid and an alg")
        self.signing_jwks: tuple[Mapping[str, Any], ...] = tuple(dict(k) for k in signing_jwks)
        """The private keys the provider signs with, the default first (tests may forge
        with them)."""
        self.client_assertion_audience = client_assertion_audience
        self.access_token_seconds = access_token_seconds
        self.modules = modules
        self.log_file = workdir / "provider.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.discovery: dict[str, Any] = {}

    # ---- lifecycle

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        issuer: str,
        clients: Sequence[Client],
        resources: Sequence[Resource],
        signing_jwks: Sequence[Mapping[str, Any]] | None = None,
        client_assertion_audience: str = "token-endpoint",
        access_token_seconds: int = 600,
        modules: Path | None = None,
    ) -> OidcProvider:
        """Write the settings under ``workdir`` (made 0700), start ``node``, and return once
        the discovery document names ``issuer``. ``signing_jwks`` are private JWKs with
        ``kid`` and ``alg``, the default one first (a resource's ``alg`` picks another);
        without them the provider signs with a new RS256 key."""
        workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(workdir, 0o700)
        provider = cls(
            workdir=workdir,
            issuer=issuer.rstrip("/"),
            clients=clients,
            resources=resources,
            signing_jwks=signing_jwks or [generate_private_jwk("RS256")],
            client_assertion_audience=client_assertion_audience,
            access_token_seconds=access_token_seconds,
            modules=modules or ensure_installed(),
        )
        try:
            provider._launch()
        except BaseException:
            provider.stop()
            raise
        return provider

    def restart(self, *, client_assertion_audience: str | None = None) -> None:
        """Stop and start again on the same port with the same key and registrations
        (tokens issued before stay valid; the provider's in-memory state is gone)."""
        self.stop()
        if client_assertion_audience is not None:
            if client_assertion_audience not in ASSERTION_AUDIENCES:
                raise ProviderError(
                    f"client_assertion_audience must be one of {ASSERTION_AUDIENCES}"
                )
            self.client_assertion_audience = client_assertion_audience
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the provider (closing its standard input, then SIGTERM, then SIGKILL)."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError, ValueError):
                assert process.stdin is not None
                process.stdin.close()
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=STOP_TIMEOUT_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> OidcProvider:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # ---- what tests use

    @property
    def signing_jwk(self) -> Mapping[str, Any]:
        """The default signing key (private)."""
        return self.signing_jwks[0]

    @property
    def token_endpoint(self) -> str:
        return str(self.discovery["token_endpoint"])

    @property
    def jwks_uri(self) -> str:
        return str(self.discovery["jwks_uri"])

    def token_request(
        self,
        client_id: str,
        secret: str,
        *,
        resource: str | None = None,
        scope: str | None = None,
    ) -> httpx.Response:
        """A client credentials request with ``client_secret_basic``; the raw answer."""
        form = {"grant_type": "client_credentials"}
        if resource is not None:
            form["resource"] = resource
        if scope is not None:
            form["scope"] = scope
        return httpx.post(self.token_endpoint, data=form, auth=(client_id, secret), timeout=10.0)

    def access_token(self, client_id: str, *, resource: str | None = None) -> str:
        """An access token for a ``client_secret_basic`` client registered here."""
        [client] = [c for c in self.clients if c.client_id == client_id]
        if client.secret is None:
            raise ProviderError(f"client {client_id} authenticates with private_key_jwt")
        answer = self.token_request(client_id, client.secret, resource=resource)
        if answer.status_code != 200:
            error = answer.json().get("error") if answer.content else None
            raise ProviderError(
                f"token request of {client_id} refused ({answer.status_code} {error})"
            )
        return str(answer.json()["access_token"])

    def requests(self) -> dict[str, int]:
        """How many requests the provider answered, by ``"METHOD /path"``."""
        counts = self._counts()["requests"]
        return {str(name): int(count) for name, count in counts.items()}

    def token_answers(self) -> dict[str, dict[int, int]]:
        """Token endpoint answers by the registered client a request named (authenticated or
        not): client id → status → count."""
        tokens = self._counts()["tokens"]
        return {
            str(client): {int(status): int(n) for status, n in statuses.items()}
            for client, statuses in tokens.items()
        }

    def _counts(self) -> dict[str, Any]:
        answer = httpx.get(self.issuer + "/harness/requests", timeout=5.0)
        answer.raise_for_status()
        counts: dict[str, Any] = answer.json()
        return counts

    def log_text(self) -> str:
        """What the provider wrote so far (request lines and warnings)."""
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # ---- internals

    def _settings(self, ready_fd: int) -> dict[str, Any]:
        return {
            "version": VERSION,
            "modules": str(self.modules),
            "issuer": self.issuer,
            "host": LOOPBACK,
            "port": self.port,
            "readyFd": ready_fd,
            "signingKeys": [dict(key) for key in self.signing_jwks],
            "cookieKey": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii"),
            "accessTokenSeconds": self.access_token_seconds,
            "clientAssertionAudience": self.client_assertion_audience,
            "clients": [client.to_json() for client in self.clients],
            "resources": [resource.to_json() for resource in self.resources],
        }

    def _launch(self) -> None:
        node = find_node()
        read_end, write_end = os.pipe()
        # The child keeps the pipe's write end under the same number (pass_fds).
        settings_file = self.workdir / "provider.json"
        _write_private(settings_file, json.dumps(self._settings(write_end)).encode("utf-8"))
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self._process = subprocess.Popen(
                [node, str(SCRIPT), str(settings_file)],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, "NODE_ENV": "test"},
                pass_fds=(write_end,),
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        try:
            self._await_ready(read_end)
        finally:
            os.close(read_end)
        self.discovery = self._read_discovery()

    def _await_ready(self, read_end: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        received = b""
        while b"\n" not in received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProviderError(
                    f"oidc-provider not ready after {START_TIMEOUT_SECONDS:.0f} s\n{self._tail()}"
                )
            readable, _, _ = select.select([read_end], [], [], left)
            if not readable:
                continue
            chunk = os.read(read_end, 64)
            if not chunk:  # the provider exited (or closed the pipe) before it listened
                raise ProviderError(f"oidc-provider did not start\n{self._tail()}")
            received += chunk
        if received.strip() != b"ready":
            raise ProviderError(f"oidc-provider said something unexpected\n{self._tail()}")

    def _read_discovery(self) -> dict[str, Any]:
        answer = httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=10.0)
        try:
            document = answer.json()
        except ValueError:
            document = None
        if (
            answer.status_code != 200
            or not isinstance(document, dict)
            or document.get("issuer") != self.issuer
        ):
            raise ProviderError("the discovery document does not name the issuer it serves")
        return document

    def _tail(self) -> str:
        if self._log is not None:
            self._log.flush()
        return "\n".join(self.log_text().splitlines()[-20:])


class OidcProviders:
    """Starts :class:`OidcProvider` instances and remembers them to stop them all."""

    def __init__(self, modules: Path) -> None:
        self._modules = modules
        self.started: list[OidcProvider] = []

    def start(
        self,
        workdir: Path,
        *,
        issuer: str,
        clients: Sequence[Client],
        resources: Sequence[Resource],
        signing_jwks: Sequence[Mapping[str, Any]] | None = None,
        client_assertion_audience: str = "token-endpoint",
    ) -> OidcProvider:
        """A running provider at ``issuer`` (``http://127.0.0.1:<port>``)."""
        provider = OidcProvider.start(
            workdir,
            issuer=issuer,
            clients=clients,
            resources=resources,
            signing_jwks=signing_jwks,
            client_assertion_audience=client_assertion_audience,
            modules=self._modules,
        )
        self.started.append(provider)
        return provider

    def stop_all(self) -> None:
        for provider in self.started:
            provider.stop()


# --------------------------------------------------------------------------- a stack around it


@dataclass
class ProviderStack(LocalStack):
    """A :class:`~devstack.stack.LocalStack` whose issuer is an :class:`OidcProvider`.

    Build it with :meth:`LocalStack.prepare`, start a provider at ``summary["issuer"]`` with
    :meth:`registrations` and set :attr:`provider`, then :meth:`start_products` (the
    stand-ins only: the development issuer is not started) and the coordinator. Callers
    (the runtime file's producer and operator clients) get their tokens from the provider
    with ``client_secret_basic`` and ``resource=<public URL>``.
    """

    provider: OidcProvider | None = None
    caller_secrets: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def prepare(
        cls,
        root: Path,
        *,
        packages: Sequence[tuple[Path, str]],
        database: DatabaseHandle,
        result_check_seconds: int = 60,
    ) -> ProviderStack:
        """As :meth:`LocalStack.prepare` (the development issuer's state is written but
        never used)."""
        stack = super().prepare(
            root, packages=packages, database=database, result_check_seconds=result_check_seconds
        )
        if not isinstance(stack, ProviderStack):
            raise TypeError("LocalStack.prepare made another class")
        return stack

    def registrations(self) -> tuple[list[Client], list[Resource]]:
        """The provider's clients and resources for this stack (see :func:`registrations`)."""
        if not self.caller_secrets:
            for key in ("producerClientId", "operatorClientId"):
                self.caller_secrets[self.summary[key]] = secrets.token_urlsafe(32)
        return registrations(self.runtime_file, self.caller_secrets)

    def start_products(self) -> None:
        """Start every stand-in the deployment's connections use; the provider must run."""
        if self.provider is None or not self.provider.running:
            raise ProviderError("start the provider before the stand-ins")
        for kind in self.product_urls:
            serve = ["serve"] if kind == "casework-review-producer" else []
            settings = str(self.root / f"{kind}.json")
            module = CONNECTION_MODULES[kind]
            self.spawn(kind, [sys.executable, "-m", module, *serve, "--settings", settings])
        for kind, url in self.product_urls.items():
            wait_until(
                lambda url=url: http_ok(url + "/dev/stats"), kind, process=self.processes[kind]
            )

    def caller_token(self, role: str, *, resource: str | None = None) -> str:
        """A token from the provider for the ``producer`` or ``operator`` client, for the
        gateway's public URL unless another ``resource`` is named."""
        if self.provider is None:
            raise ProviderError("the stack has no provider")
        client_id = self.summary["producerClientId" if role == "producer" else "operatorClientId"]
        return self.provider.access_token(client_id, resource=resource or self.url)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """Install the pinned provider (``make oidc-provider``) and print its node_modules."""
    parser = argparse.ArgumentParser(
        prog="python -m devstack.oidc_provider", description=main.__doc__
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="default: .cache/oidc-provider"
    )
    args = parser.parse_args(argv)
    try:
        find_node()
        path = ensure_installed(args.cache_dir)
    except (ProviderError, OSError, subprocess.SubprocessError) as error:
        print(f"oidc_provider: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
