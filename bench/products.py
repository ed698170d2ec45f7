"""The product stand-ins as the bench runs them, over plain HTTP or, with
``--products-tls``, over HTTPS.

Plain is what ``make quickstart`` serves: ``http://127.0.0.1:<port>`` base URLs, which the
runtime file check allows because the host is loopback. With ``--products-tls`` the bench
makes a private root for the run (:class:`devstack.postgres_tls.CertificateAuthority`, the
kind the local PostgreSQL's certificate comes from) and a server certificate for 127.0.0.1
under it. Then, before anything starts:

- the root's PEM goes into the deployment's secrets folder as ``products-root.pem`` (0600,
  beside the other secrets the local deployment holds);
- every connection of the runtime file gets an ``https://`` base URL on the same port and
  ``trustedRootCertificateRef: secret:file/products-root.pem``, so the dispatcher trusts
  that root for its product calls and nothing else;
- each stand-in's settings get the same ``https://`` base URL (it is the audience the
  stand-in expects in the coordinator's tokens).

Both modes start the stand-ins through this module's :func:`main` rather than the
stand-ins' own entry points, so the only difference between the two is TLS. It serves the
same stand-in application under uvicorn as ``devstack.products.common.serve_main`` does,
adds the certificate when given one, and counts, outside the stand-in, what it served:
requests by scheme and the connections they came on (each TLS connection is one full
handshake; a keep-alive connection carries many requests). ``GET /bench/connections``
answers those counts; the bench reads them at the end to show that TLS was really spoken.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import ssl
import sys
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from devstack.postgres_tls import LOOPBACK, CertificateAuthority
from devstack.stack import CONNECTION_MODULES, LocalStack, wait_until

ROOT_FILE = "products-root.pem"
ROOT_REF = f"secret:file/{ROOT_FILE}"
COUNTS_PATH = "/bench/connections"
PLAIN = "plain"
TLS = "products-tls"


@dataclass(frozen=True)
class ProductsTls:
    """The files of one run's private root and the stand-ins' certificate."""

    root: Path
    certificate: Path
    key: Path


def make_tls(folder: Path) -> ProductsTls:
    """A new private root and a server certificate for 127.0.0.1 (and localhost) under it,
    written to ``folder``; the key file is 0600."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = CertificateAuthority.create("Registry Coordinator bench products root")
    certificate, key = authority.issue_server((LOOPBACK, "localhost"))
    files = ProductsTls(folder / "root.pem", folder / "server.pem", folder / "server-key.pem")
    files.root.write_bytes(authority.pem)
    files.certificate.write_bytes(certificate)
    _write_private(files.key, key)
    return files


def use_https(stack: LocalStack, tls: ProductsTls) -> None:
    """Rewrite ``stack``'s prepared deployment so every product connection is ``https://``
    and names the private root with ``trustedRootCertificateRef``; call it after
    :meth:`LocalStack.prepare` and before anything reads the runtime file."""
    _write_private(Path(str(stack.summary["secretsDir"])) / ROOT_FILE, tls.root.read_bytes())
    text = stack.runtime_file.read_text(encoding="utf-8")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    document = yaml.safe_load(text)
    for connection in document["connections"].values():
        connection["baseUrl"] = https(str(connection["baseUrl"]))
        connection["trustedRootCertificateRef"] = ROOT_REF
    header += "# bench --products-tls: product base URLs are https and trust products-root.pem.\n"
    stack.runtime_file.write_text(
        header + yaml.safe_dump(document, sort_keys=False), encoding="utf-8"
    )
    for kind, url in stack.product_urls.items():
        path = stack.root / f"{kind}.json"
        settings = json.loads(path.read_text())
        settings["baseUrl"] = https(url)
        path.write_text(json.dumps(settings, indent=2) + "\n")
        stack.product_urls[kind] = https(url)


def https(url: str) -> str:
    """``url`` with ``https://`` for ``http://``."""
    if not url.startswith("http://"):
        raise ValueError(f"not a plain http URL: {url}")
    return "https://" + url.removeprefix("http://")


def client_verify(stack: LocalStack) -> ssl.SSLContext | bool:
    """What the bench's own requests to the stand-ins verify with: the private root the
    deployment holds when they serve https, the default otherwise."""
    if not any(url.startswith("https://") for url in stack.product_urls.values()):
        return True
    root = Path(str(stack.summary["secretsDir"])) / ROOT_FILE
    return ssl.create_default_context(cadata=root.read_text(encoding="ascii"))


def start_products(stack: LocalStack, tls: ProductsTls | None) -> None:
    """The development issuer, then every stand-in of ``stack`` under this module (with
    ``tls``'s certificate when given), each waited for until it answers."""
    kinds = dict(stack.product_urls)
    # LocalStack.start_products starts the issuer and then each stand-in it lists; listing
    # none makes it start (and wait for) the issuer alone.
    stack.product_urls.clear()
    try:
        stack.start_products()
    finally:
        stack.product_urls.update(kinds)
    verify = client_verify(stack)
    for kind, url in kinds.items():
        command = [sys.executable, "-m", "bench.products", kind, str(stack.root / f"{kind}.json")]
        if tls is not None:
            command += ["--certificate", str(tls.certificate), "--key", str(tls.key)]
        stack.spawn(kind, command)
        wait_until(
            lambda url=url: httpx.get(url + "/dev/stats", verify=verify, timeout=2.0).is_success,
            kind,
            process=stack.processes[kind],
        )


def served(stack: LocalStack, kind: str) -> dict[str, Any]:
    """What the stand-in ``kind`` counted (see :class:`Counting`)."""
    url = stack.product_urls[kind] + COUNTS_PATH
    answer = httpx.get(url, verify=client_verify(stack), timeout=10.0)
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


# ------------------------------------------------------------------------------ serving


class Counting:
    """An ASGI wrapper around a stand-in: counts requests by scheme and the connections
    they arrived on (and each TLS connection's protocol version), and answers those counts
    at :data:`COUNTS_PATH` without passing that request on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: Counter[str] = Counter()
        self.connections = 0
        self.uncounted = 0
        """Requests whose connection could not be told (no transport found)."""
        self.protocols: Counter[str] = Counter()
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()

    def counts(self) -> dict[str, Any]:
        """Requests by scheme, connections (None when some request's could not be told) and
        the TLS version of each TLS connection."""
        return {
            "requests": dict(self.requests),
            "connections": None if self.uncounted else self.connections,
            "tls_protocols": dict(self.protocols),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["path"] == COUNTS_PATH:
                await JSONResponse(self.counts())(scope, receive, send)
                return
            self.requests[str(scope["scheme"])] += 1
            self._count_connection(receive)
        await self.app(scope, receive, send)

    def _count_connection(self, receive: Receive) -> None:
        # uvicorn's receive is a method of the request's cycle, which holds the connection's
        # transport (uvloop's transports are not asyncio.BaseTransport, so this does not ask
        # for one). A connection is known by an object that lives exactly as long as it: its
        # SSLObject under TLS (uvloop's TLS transport takes no weak reference), its
        # transport otherwise.
        transport = getattr(getattr(receive, "__self__", None), "transport", None)
        if transport is None or not hasattr(transport, "get_extra_info"):
            self.uncounted += 1
            return
        ssl_object = transport.get_extra_info("ssl_object")
        marker = ssl_object if ssl_object is not None else transport
        if marker in self._seen:
            return
        self._seen.add(marker)
        self.connections += 1
        if ssl_object is not None:
            self.protocols[str(ssl_object.version())] += 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.products KIND SETTINGS [--certificate FILE --key FILE]``."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.products", description=__doc__)
    parser.add_argument("kind", choices=sorted(CONNECTION_MODULES), help="connection type")
    parser.add_argument("settings", type=Path, help="the stand-in's settings file (JSON)")
    parser.add_argument("--certificate", type=Path, help="serve HTTPS with this PEM chain")
    parser.add_argument("--key", type=Path, help="the certificate's private key (PEM)")
    args = parser.parse_args(argv)
    if (args.certificate is None) != (args.key is None):
        parser.error("--certificate and --key go together")
    document: Mapping[str, Any] = json.loads(args.settings.read_text())
    module = importlib.import_module(CONNECTION_MODULES[args.kind])
    app = Counting(module.build(document, args.settings.resolve().parent))
    host, _, port = str(document["bind"]).rpartition(":")
    tls: dict[str, Any] = {}
    if args.certificate is not None:
        tls = {"ssl_certfile": str(args.certificate), "ssl_keyfile": str(args.key)}
    # As the stand-ins' own entry point serves them: uvicorn's h11 protocol (httptools is
    # not installed, so it is theirs too) on the loop uvicorn picks (uvloop).
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        http="h11",
        log_level="warning",
        timeout_graceful_shutdown=5,
        **tls,
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1


def _write_private(path: Path, data: bytes) -> None:
    # 0600 from the first byte, and never over an existing file.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with contextlib.closing(os.fdopen(fd, "wb")) as out:
        out.write(data)


if __name__ == "__main__":
    raise SystemExit(main())
