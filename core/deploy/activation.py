"""Verify an activation before serving or reporting it (CONTRACT §6.4, §7.4).

:func:`verify_activation` is what every component calls at startup (on its own connection,
after ``SET ROLE`` to its component role) and what ``deployment-status`` reports: the
runtime role, schema version 4, the databaseId, the active packages against the runtime
file's pins, and key custody. Each failure is ``deployment.refused`` except custody, which
is ``command.state-key-custody``.
"""

from __future__ import annotations

import asyncpg

from core.codes import Code
from core.config.model import CheckedDeployment
from core.db.roles import verify_runtime_role
from core.db.schema import inspect_namespace, read_version, refuse_unknown_layout, require_version
from core.db.statements import Statements
from core.deploy.custody import check_custody, configured_keys, read_records
from core.deploy.model import Activation, ActivePackage
from core.errors import CoordinatorError
from core.keys import resolver_for
from core.secrets import SecretResolver


async def read_active(conn: asyncpg.Connection, queries: Statements) -> dict[str, ActivePackage]:
    """The active package of every workflow, ordered by id."""
    return {
        row.workflow_id: ActivePackage(
            workflow_id=row.workflow_id,
            digest=row.digest,
            version=row.version,
            manifest_bytes=row.manifest,
            source_bytes=row.source,
            activated_serial=row.activated_serial,
        )
        for row in await queries.activation_list(conn)
    }


async def require_installed(conn: asyncpg.Connection, namespace: str) -> None:
    """Refuse a namespace in which apply has not installed a schema."""
    state = await inspect_namespace(conn, namespace)
    if not state.exists or state.empty:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"namespace {namespace} holds no Registry Coordinator schema; run apply",
        )
    if not state.has_version_table:
        raise refuse_unknown_layout(namespace)


def check_database_id(recorded: str, configured: str, namespace: str) -> None:
    """Refuse a databaseId that differs from the recorded one."""
    if recorded.lower() != configured.lower():
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"deployment.databaseId differs from the databaseId recorded in namespace {namespace}",
        )


def check_pins(checked: CheckedDeployment, active: dict[str, ActivePackage]) -> None:
    """Refuse unless the active packages are exactly the runtime file's pinned ones."""
    listed = {workflow_id: package.digest for workflow_id, package in checked.packages.items()}
    for workflow_id in sorted(listed.keys() | active.keys()):
        current = active.get(workflow_id)
        pinned = listed.get(workflow_id)
        if current is None:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"workflow '{workflow_id}' is listed but not active; run plan and apply",
            )
        if pinned is None:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"workflow '{workflow_id}' is active but not listed; run plan and apply",
            )
        if current.digest != pinned:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"workflow '{workflow_id}': the active package is not the one the runtime file "
                "pins; run plan and apply",
            )


async def verify_activation(
    conn: asyncpg.Connection,
    checked: CheckedDeployment,
    *,
    resolver: SecretResolver | None = None,
) -> Activation:
    """Verify everything a component needs before it serves; answer the activation.

    ``conn`` is a runtime connection that has already ``SET ROLE`` to one of the
    deployment's component roles (each may read what this needs).
    """
    config = checked.config
    namespace = config.namespace
    queries = Statements(namespace)
    await require_installed(conn, namespace)
    await verify_runtime_role(conn, config.deployment.runtime_role, namespace)
    version = await read_version(conn, namespace)
    require_version(namespace, version)
    identity = await queries.deployment_read(conn)
    if identity is None:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"namespace {namespace} records no databaseId; run apply"
        )
    check_database_id(identity.database_id, config.deployment.database_id, namespace)
    active = await read_active(conn, queries)
    check_pins(checked, active)
    keys = configured_keys(config, resolver or resolver_for(config))
    check_custody(await read_records(conn, queries), keys, require_recorded=True)
    return Activation(
        namespace=namespace,
        database_id=identity.database_id,
        schema_version=version,
        serial=identity.activation_serial,
        packages=active,
    )
