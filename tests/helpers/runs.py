"""Insert a started run the way admission does, without the admission component.

The rows follow the serving core's data model: in one transaction, the start identity
(keyed by the admission key, with a keyed digest of the input), the run (state
``running``), a binding per connection the workflow uses (from the runtime file), the
sealed input payload and the first step, due now. The step table's trigger notifies the
namespace's ``_due`` channel, so a listening dispatcher wakes up.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from core import clock
from core.config.model import CheckedDeployment
from core.crypto import keyring_from_config, seal
from core.derive import api_start_identity, run_id
from core.keys import resolver_for
from core.payloads import encode_json
from core.runtime import Store
from core.workflow.model import step_kind

PRINCIPAL = ("https://issuer.example.org", "test-principal")
CLIENT_ID = "test-client"


@asynccontextmanager
async def _transaction(store_or_conn: Store | asyncpg.Connection) -> AsyncIterator[Any]:
    if isinstance(store_or_conn, Store):
        async with store_or_conn.connection() as conn, conn.transaction():
            await clock.apply_to(conn)
            yield conn
    else:
        async with store_or_conn.transaction():
            await clock.apply_to(store_or_conn)
            yield store_or_conn


async def insert_started_run(
    store_or_conn: Store | asyncpg.Connection,
    checked: CheckedDeployment,
    workflow_id: str,
    input: Any,
    *,
    idempotency_key: str | None = None,
) -> str:
    """Admit a run of ``workflow_id`` with ``input``; answers its run id.

    ``store_or_conn`` is an admission :class:`Store` or a connection allowed to insert
    runs (the migration role's, say). The run is started by :data:`PRINCIPAL`.
    """
    config = checked.config
    namespace = config.namespace
    resolver = resolver_for(config)
    admission_key = resolver.read_key(config.deployment.admission_key_ref)
    keyring = keyring_from_config(config, resolver)
    package = checked.packages[workflow_id]
    workflow = package.workflow
    iss, sub = PRINCIPAL
    identity = api_start_identity(
        admission_key, iss, sub, workflow_id, idempotency_key or secrets.token_hex(8)
    )
    new_run = run_id(admission_key, identity)
    input_bytes = encode_json(input)
    input_digest = hmac.new(admission_key, input_bytes, hashlib.sha256).hexdigest()
    sealed = seal(keyring, namespace, new_run, "input", input_bytes)
    ns = f'"{namespace}"'
    async with _transaction(store_or_conn) as conn:
        await conn.execute(
            f"INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, "
            "principal_sub, client_id, state) VALUES ($1, $2, $3, $4, $5, $6, 'running')",
            new_run,
            workflow_id,
            package.digest,
            iss,
            sub,
            CLIENT_ID,
        )
        await conn.execute(
            f"INSERT INTO {ns}.start_identity (identity, run_id, input_digest) VALUES ($1, $2, $3)",
            identity,
            new_run,
            input_digest,
        )
        for name in sorted(workflow.connections):
            connection = config.connections[name]
            await conn.execute(
                f"INSERT INTO {ns}.binding (run_id, connection, connection_type, base_url, "
                "client_id, issuer, scopes, audience, profile, producer) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                new_run,
                name,
                connection.type,
                connection.base_url,
                connection.authorization.client_id,
                config.deployment.authentication.issuer,
                list(connection.authorization.scopes),
                connection.token_audience,
                connection.profile,
                connection.producer,
            )
        await conn.execute(
            f"INSERT INTO {ns}.payload (run_id, step_id, purpose, key_version, nonce, "
            "ciphertext) VALUES ($1, NULL, 'input', $2, $3, $4)",
            new_run,
            sealed.key_version,
            sealed.nonce,
            sealed.ciphertext,
        )
        await conn.execute(
            f"INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at) "
            f"VALUES ($1, $2, 1, $3, 'ready', {ns}.now())",
            new_run,
            workflow.start,
            step_kind(workflow.step(workflow.start)),
        )
    return new_run
