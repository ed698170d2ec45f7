"""Where components listen and how they reach each other.

By default every component listens on a Unix socket in one 0700 directory, so only the
service user can reach it. When ``deployment.internal.addresses`` names TCP addresses, the
channel is mutual TLS with the configured certificate, key and private root.
"""

from __future__ import annotations

import errno
import os
import stat
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
SOCKET_DIR_KEY = "deployment.internal.socketDir"
SOCKET_DIR_MODE = 0o700


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
    prepare_socket_folder(socket_dir)
    return Endpoints(
        {name: f"unix:{socket_dir / (name + '.sock')}" for name in COMPONENTS if name != "gateway"}
    )


def prepare_socket_folder(folder: Path) -> Path:
    """Create ``folder`` 0700, or take the one there when it is a real folder of this user and
    make it 0700; anything else is ``deployment.refused`` naming the socket folder key.

    The owner is judged before the mode is set: setting it first fails on another user's
    folder with the system's own error or, run by root, changes that user's folder and only
    then refuses it. The folder is opened without following a symbolic link, and judged and
    changed through that one descriptor, so what is judged is what is changed.
    """
    try:
        folder.mkdir(mode=SOCKET_DIR_MODE, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _folder_refused(folder, f"cannot be created ({errno_name(exc)})") from None
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _folder_refused(folder, _unopenable(folder, exc)) from None
    try:
        info = os.fstat(handle)
        if info.st_uid != os.geteuid():
            raise _folder_refused(
                folder,
                "belongs to another user; make the coordinator's user its owner, "
                "or name a folder of its own",
            )
        if stat.S_IMODE(info.st_mode) != SOCKET_DIR_MODE:
            try:
                os.fchmod(handle, SOCKET_DIR_MODE)
            except OSError as exc:
                raise _folder_refused(folder, f"cannot be made 0700 ({errno_name(exc)})") from None
    finally:
        os.close(handle)
    return folder


def _unopenable(folder: Path, exc: OSError) -> str:
    # Linux answers a symbolic link opened this way with ENOTDIR (ELOOP elsewhere); look at
    # the entry itself to say which, for the message only.
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        if folder.is_symlink():
            return "is a symbolic link; name the folder itself"
        return "is not a folder"
    return f"cannot be opened ({errno_name(exc)})"


def _folder_refused(folder: Path, problem: str) -> CoordinatorError:
    return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"{SOCKET_DIR_KEY}: {folder} {problem}")


def errno_name(exc: OSError) -> str:
    """The symbolic name of ``exc``'s errno (``EACCES``), for one-line refusals."""
    return errno.errorcode.get(exc.errno or 0, "error")


def _options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # gRPC core would send a TCP channel through grpc_proxy / https_proxy / http_proxy
        # from the environment; components talk to each other directly, always.
        ("grpc.enable_http_proxy", 0),
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
