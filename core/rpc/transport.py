"""Where components listen and how they reach each other.

By default every component listens on a Unix socket in one 0700 directory, so only the
service user can reach it. When ``deployment.internal.addresses`` names TCP addresses, the
channel is mutual TLS with the configured certificate, key and private root.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from core.codes import Code
from core.errors import CoordinatorError
from core.rpc.errors import rebuild

COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")
DEFAULT_DEADLINE_SECONDS = 10.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
UNIX_PATH_MAX_BYTES = 107


@dataclass(frozen=True)
class TlsMaterial:
    """PEM material for mutual TLS on the internal channel."""

    certificate: bytes
    private_key: bytes
    trusted_root: bytes


@dataclass(frozen=True)
class Endpoints:
    """The internal address of each gRPC component and, for TCP, the TLS material."""

    addresses: dict[str, str]
    tls: TlsMaterial | None = None

    def address(self, component: str) -> str:
        """The address ``component`` listens on."""
        return self.addresses[component]


def default_socket_dir(namespace: str) -> Path:
    """``$XDG_RUNTIME_DIR/registry-coordinator/<ns>`` or ``/run/registry-coordinator/<ns>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "registry-coordinator" if runtime else Path("/run/registry-coordinator")
    return base / namespace


def unix_endpoints(socket_dir: Path) -> Endpoints:
    """Endpoints on Unix sockets in ``socket_dir`` (created 0700 when missing)."""
    socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = socket_dir.stat()
    if info.st_mode & 0o077:
        os.chmod(socket_dir, 0o700)
    if info.st_uid != os.geteuid():
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"{socket_dir}: the internal socket folder belongs to another user",
        )
    return Endpoints(
        {name: f"unix:{socket_dir / (name + '.sock')}" for name in COMPONENTS if name != "gateway"}
    )


def _options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


def server(endpoints: Endpoints, component: str) -> grpc.aio.Server:
    """A grpc.aio server bound to ``component``'s address (not yet started)."""
    srv = grpc.aio.server(options=_options())
    address = endpoints.address(component)
    if address.startswith("unix:"):
        path = Path(address[len("unix:") :])
        if path.exists() or path.is_symlink():
            path.unlink()
        if len(str(path).encode()) > UNIX_PATH_MAX_BYTES:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"deployment.internal.socketDir: the socket path {path} is longer than "
                f"{UNIX_PATH_MAX_BYTES} bytes",
            )
        _bind(srv.add_insecure_port, address)
    else:
        if endpoints.tls is None:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED, "TCP internal addresses need mutual TLS"
            )
        credentials = grpc.ssl_server_credentials(
            [(endpoints.tls.private_key, endpoints.tls.certificate)],
            root_certificates=endpoints.tls.trusted_root,
            require_client_auth=True,
        )
        _bind(lambda where: srv.add_secure_port(where, credentials), address)
    return srv


def _bind(add: Callable[[str], int], address: str) -> None:
    # grpc raises a bare RuntimeError when it cannot bind; say which address, as a refusal.
    try:
        add(address)
    except RuntimeError:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"deployment.internal: cannot listen on {address}"
        ) from None


def channel(endpoints: Endpoints, component: str) -> grpc.aio.Channel:
    """A channel to ``component`` (create it inside the running event loop)."""
    address = endpoints.address(component)
    if address.startswith("unix:"):
        return grpc.aio.insecure_channel(address, options=_options())
    if endpoints.tls is None:
        raise CoordinatorError(Code.DEPLOYMENT_REFUSED, "TCP internal addresses need mutual TLS")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=endpoints.tls.trusted_root,
        private_key=endpoints.tls.private_key,
        certificate_chain=endpoints.tls.certificate,
    )
    return grpc.aio.secure_channel(address, credentials, options=_options())


R = TypeVar("R")


async def call(
    component: str,
    method: Callable[..., Awaitable[R]],
    request: Any,
    *,
    timeout: float = DEFAULT_DEADLINE_SECONDS,
) -> R:
    """Call one RPC with a deadline; refusals come back as CoordinatorError."""
    try:
        return await method(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise rebuild(exc, component) from None
