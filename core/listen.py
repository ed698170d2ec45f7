"""Listening sockets on configured addresses, bound before any server starts, and the
folder the internal Unix sockets go in, judged before anything is placed in it.

A busy or forbidden address, or a socket folder that is not ours, becomes one clear
``deployment.refused`` instead of a server library or the system leaving the process with
its own message.
"""

from __future__ import annotations

import socket

from core.codes import Code
from core.config.model import BindAddress
from core.errors import CoordinatorError
from core.rpc.transport import errno_name


def bind_socket(bind: BindAddress) -> socket.socket:
    """A listening TCP socket on ``bind``; failures are ``deployment.refused``."""
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    host = "127.0.0.1" if bind.host == "localhost" else bind.host
    try:
        sock = socket.create_server((host, bind.port), family=family, backlog=1024)
    except OSError as exc:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"cannot listen on {bind} ({errno_name(exc)})"
        ) from None
    sock.setblocking(False)
    return sock
