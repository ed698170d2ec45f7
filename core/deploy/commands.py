"""``plan``, ``apply`` and ``deployment-status`` (CONTRACT §2.2, §6, §7.4).

``plan`` and ``status`` connect with the runtime URL and read through the recovery role;
``apply`` is the only code that reads the migration URL. ``apply`` does all of its work in
one transaction under an advisory lock on the namespace, so two applies at once end as if
one ran after the other, and a refusal part-way leaves nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from core.codes import Code
from core.config.model import CheckedDeployment
from core.db import statements
from core.db.connect import require_server_version
from core.db.roles import (
    check_runtime_role_attributes,
    check_runtime_role_schema,
    ensure_component_roles,
    grant_components,
    set_component_role,
    verify_runtime_role,
)
from core.db.schema import (
    ensure_schema,
    inspect_namespace,
    read_version,
    refuse_unknown_layout,
    require_version,
)
from core.db.statements import Statements
from core.deploy.activation import check_database_id, read_active, verify_activation
from core.deploy.custody import check_custody, configured_keys, read_records, record_new_keys
from core.deploy.database import apply_lock_key, open_connection, runtime_url_user
from core.deploy.model import DeploymentStatus, PlanEntry
from core.deploy.planning import compute_plan, removal_ids
from core.errors import CoordinatorError
from core.keys import resolver_for


def _listed(checked: CheckedDeployment) -> dict[str, str]:
    return {workflow_id: package.digest for workflow_id, package in checked.packages.items()}


async def _refuse_live_runs(
    conn: asyncpg.Connection, queries: Statements, entries: Sequence[PlanEntry]
) -> None:
    for entry in entries:
        if entry.action != "remove":
            continue
        live = await queries.live_run_count(conn, workflow_id=entry.id)
        if live:
            raise CoordinatorError(
                Code.DEPLOYMENT_WORKFLOW_LIVE_RUNS,
                f"workflow '{entry.id}' has {live} run(s) that have not ended",
            )


async def plan(checked: CheckedDeployment, remove: list[str]) -> list[PlanEntry]:
    """What apply would do to each workflow, read with the runtime URL only."""
    config = checked.config
    namespace = config.namespace
    removal_ids(remove)
    resolver = resolver_for(config)
    async with open_connection(config, resolver, "runtime") as conn:
        await require_server_version(conn)
        await verify_runtime_role(conn, config.deployment.runtime_role)
        state = await inspect_namespace(conn, namespace)
        if not state.exists or state.empty:
            return compute_plan(_listed(checked), {}, remove)
        if not state.has_version_table:
            raise refuse_unknown_layout(namespace)
        await set_component_role(conn, namespace, "recovery")
        require_version(namespace, await read_version(conn, namespace))
        await verify_runtime_role(conn, config.deployment.runtime_role, namespace)
        queries = Statements(namespace)
        identity = await queries.deployment_read(conn)
        if identity is not None:
            check_database_id(identity.database_id, config.deployment.database_id, namespace)
        active = await read_active(conn, queries)
        entries = compute_plan(
            _listed(checked), {wid: pkg.digest for wid, pkg in active.items()}, remove
        )
        await _refuse_live_runs(conn, queries, entries)
        return entries


async def apply(checked: CheckedDeployment, remove: list[str]) -> list[PlanEntry]:
    """Install or verify schema 4, reset the component grants, check the runtime role,
    record key custody and activate the runtime file's packages; answer what changed."""
    config = checked.config
    namespace = config.namespace
    runtime_role = config.deployment.runtime_role
    removal_ids(remove)
    resolver = resolver_for(config)
    url_user = runtime_url_user(config, resolver)
    if url_user != runtime_role:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"runtime role: the runtime URL logs in as {url_user}, "
            f"but deployment.runtimeRole is {runtime_role}",
        )
    # Key files are read before anything else is touched: a bad one refuses at once.
    keys = configured_keys(config, resolver)
    queries = Statements(namespace)
    async with open_connection(config, resolver, "migration") as conn:
        await require_server_version(conn)
        async with conn.transaction():
            await statements.apply_lock(conn, lock_key=apply_lock_key(namespace))
            migration_role = await statements.current_user_name(conn)
            await check_runtime_role_attributes(conn, runtime_role, migration_role)
            await check_runtime_role_schema(conn, runtime_role, namespace, table_privileges=False)
            await ensure_schema(conn, namespace)
            identity = await queries.deployment_read(conn)
            if identity is None:
                await queries.deployment_insert(
                    conn,
                    database_id=config.deployment.database_id,
                    migration_role=migration_role,
                )
            else:
                check_database_id(identity.database_id, config.deployment.database_id, namespace)
            await ensure_component_roles(conn, namespace)
            await grant_components(conn, namespace, runtime_role)
            await check_runtime_role_schema(conn, runtime_role, namespace)
            records = await read_records(conn, queries)
            check_custody(records, keys, require_recorded=False)
            await record_new_keys(conn, queries, records, keys)
            active = await read_active(conn, queries)
            entries = compute_plan(
                _listed(checked), {wid: pkg.digest for wid, pkg in active.items()}, remove
            )
            await _refuse_live_runs(conn, queries, entries)
            await _activate(conn, queries, checked, entries)
    return entries


async def _activate(
    conn: asyncpg.Connection,
    queries: Statements,
    checked: CheckedDeployment,
    entries: Sequence[PlanEntry],
) -> None:
    """Record the changed entries under a new activation serial (none when nothing changed)."""
    changed = [entry for entry in entries if entry.action != "unchanged"]
    if not changed:
        return
    serial = await queries.activation_serial_raise(conn)
    if serial is None:  # unreachable: apply wrote the deployment row earlier in this transaction
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED, f"namespace {queries.namespace} records no databaseId"
        )
    for entry in changed:
        if entry.action == "remove":
            await queries.activation_remove(conn, workflow_id=entry.id)
            continue
        package = checked.packages[entry.id]
        await queries.package_insert(
            conn,
            digest=package.digest,
            workflow_id=package.workflow_id,
            version=package.version,
            manifest=package.manifest_bytes,
            source=package.source_bytes,
        )
        stored = await queries.package_read(conn, digest=package.digest)
        if stored is None or stored.manifest != package.manifest_bytes:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"workflow '{entry.id}': the database holds other bytes under digest "
                f"{package.digest}",
            )
        await queries.activation_set(
            conn, workflow_id=entry.id, digest=package.digest, serial=serial
        )


async def status(checked: CheckedDeployment) -> DeploymentStatus:
    """Verify the activation with the runtime URL and report it (``deployment-status``)."""
    config = checked.config
    namespace = config.namespace
    resolver = resolver_for(config)
    async with open_connection(config, resolver, "runtime") as conn:
        await require_server_version(conn)
        await verify_runtime_role(conn, config.deployment.runtime_role)
        state = await inspect_namespace(conn, namespace)
        if not state.exists or state.empty:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED,
                f"namespace {namespace} holds no Registry Coordinator schema; run apply",
            )
        await set_component_role(conn, namespace, "recovery")
        activation = await verify_activation(conn, checked, resolver=resolver)
    return DeploymentStatus(
        schema_version=activation.schema_version,
        database_id=activation.database_id,
        workflows=tuple((wid, package.digest) for wid, package in activation.packages.items()),
    )
