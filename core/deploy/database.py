"""Connections for the deployment commands, with driver failures turned into codes.

The URLs come from the runtime file's secret references and are handed to
:func:`core.db.connect.connect`, which never echoes them. Failures become:

- ``store.unavailable`` — the server cannot be reached, refuses connections for now, or the
  connection broke;
- ``deployment.refused`` — the server's certificate does not verify, the login or the
  database is refused, or a statement lacked a privilege.

Details name the key path of the URL (``database.runtimeUrlRef``), never the URL.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import asyncpg

from core.codes import Code
from core.config.model import RuntimeConfig
from core.db.connect import connect, parse_database_url
from core.errors import CoordinatorError
from core.secrets import SecretResolver

Which = Literal["runtime", "migration"]

RUNTIME_LABEL = "database.runtimeUrlRef"
MIGRATION_LABEL = "database.migrationUrlRef"

_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionDoesNotExistError,
    # No host of the URL accepts writes (a standby not yet promoted): wait for one that does.
    asyncpg.TargetServerAttributeNotMatched,
)


def translate(exc: BaseException, label: str) -> CoordinatorError | None:
    """The coded refusal for a driver failure, or ``None`` when it is not one we know."""
    if isinstance(exc, CoordinatorError):
        return None
    if isinstance(exc, ssl.SSLCertVerificationError):
        return CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"{label}: the database server's certificate did not verify"
        )
    if isinstance(exc, ssl.SSLError):
        return CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"{label}: the TLS handshake with the database failed"
        )
    if isinstance(
        exc, (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)
    ):
        return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"{label}: the database refused the login")
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"{label}: the database does not exist")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        # The server's wording names the object and the privilege, nothing secret.
        wording = exc.args[0] if exc.args else "permission denied"
        return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"{label}: {wording}")
    if isinstance(exc, _UNAVAILABLE):
        return CoordinatorError(Code.STORE_UNAVAILABLE, f"{label}: the database cannot be reached")
    return None


def read_url(config: RuntimeConfig, resolver: SecretResolver, which: Which) -> str:
    """The runtime or migration URL, read from its secret."""
    database = config.database
    ref = database.runtime_url_ref if which == "runtime" else database.migration_url_ref
    return resolver.read_text(ref)


def runtime_url_user(config: RuntimeConfig, resolver: SecretResolver) -> str:
    """The user the runtime URL logs in as (the URL is read, not used to connect)."""
    return parse_database_url(read_url(config, resolver, "runtime"), label=RUNTIME_LABEL).user


def trusted_root(config: RuntimeConfig, resolver: SecretResolver) -> bytes | None:
    """The private root certificate, when the runtime file names one."""
    ref = config.database.trusted_root_certificate_ref
    return None if ref is None else resolver.read_bytes(ref)


@asynccontextmanager
async def open_connection(
    config: RuntimeConfig, resolver: SecretResolver, which: Which
) -> AsyncIterator[asyncpg.Connection]:
    """One connection with the runtime or the migration URL; closed on exit.

    Driver failures while connecting and while the body runs are translated (see
    :func:`translate`); anything else passes through unchanged.
    """
    label = RUNTIME_LABEL if which == "runtime" else MIGRATION_LABEL
    url = read_url(config, resolver, which)
    root = trusted_root(config, resolver)
    try:
        conn = await connect(url, root, label=label)
    except Exception as exc:
        coded = translate(exc, label)
        if coded is None:
            raise
        raise coded from None
    try:
        yield conn
    except Exception as exc:
        coded = translate(exc, label)
        if coded is None:
            raise
        raise coded from None
    finally:
        try:
            await conn.close(timeout=5)
        except Exception:
            # A broken connection may fail to close politely; drop it.
            conn.terminate()


def apply_lock_key(namespace: str) -> int:
    """The advisory lock (signed 64-bit) that serializes applies to one namespace."""
    digest = hashlib.sha256(f"registry-coordinator apply {namespace}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
