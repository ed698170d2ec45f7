"""Component roles, their grants, and the checks on the runtime role (CONTRACT §6.2, §6.3).

Each database-using component acts as its own NOLOGIN role, ``<namespace>_admission``,
``_dispatcher``, ``_recovery`` and ``_audit``. The runtime login role is a member of each
with ``INHERIT FALSE, SET TRUE``: it holds no privilege of its own, and a component's
connections ``SET ROLE`` to the component's role right after connecting. What each role may
do is the table :data:`GRANTS` below; ``apply`` revokes everything in the namespace from
these roles and grants exactly that table again, so re-running apply also repairs grants
someone widened by hand.

The runtime role checks refuse, with ``deployment.refused``, a login role that could reach
past those grants: a superuser, a role with BYPASSRLS, a member of the migration role (or
of whichever role owns the schema), the owner of the schema, a role that can CREATE in it,
or one that holds table privileges there itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

import asyncpg

from core.db.connect import quote_ident
from core.db.queries import load, namespace_identifier
from core.errors import CoordinatorError

COMPONENTS: Final = ("admission", "dispatcher", "recovery", "audit")
"""The components that use the database, in the order their roles are made."""

REFUSED = "deployment.refused"

# Read by every component at startup to verify the activation (§6.4).
_STARTUP_READS: Final = {
    "schema_version": ("SELECT",),
    "deployment": ("SELECT",),
    "package": ("SELECT",),
    "activation": ("SELECT",),
    "key_custody": ("SELECT",),
    "hold": ("SELECT",),
}

# The non-secret columns of payload: enough to insert a row and answer its id.
_PAYLOAD_HEADER: Final = "(id, run_id, step_id, purpose, key_version, created_at)"

GRANTS: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = MappingProxyType(
    {
        # Starts runs and wakes waiting ones; it may move a wait's next check forward, but
        # not change what state a step is in.
        "admission": MappingProxyType(
            {
                **_STARTUP_READS,
                "run": ("SELECT", "INSERT"),
                "binding": ("SELECT", "INSERT"),
                "step": ("SELECT", "INSERT", "UPDATE (due_at, next_check_at, updated_at)"),
                "payload": ("INSERT", f"SELECT {_PAYLOAD_HEADER}"),
                "start_identity": ("SELECT", "INSERT"),
                "tombstone": ("SELECT",),
            }
        ),
        # Claims and executes steps and moves runs along; reads holds, never changes them.
        "dispatcher": MappingProxyType(
            {
                **_STARTUP_READS,
                "run": (
                    "SELECT",
                    "UPDATE (state, outcome, attention, cancelling, failure_kind, "
                    "failure_path, failure_step, updated_at, ended_at)",
                ),
                "binding": ("SELECT",),
                "step": ("SELECT", "INSERT", "UPDATE"),
                "payload": ("SELECT", "INSERT"),
            }
        ),
        # Operator actions: inspection, reconcile, retry-same, cancel, holds and retention.
        "recovery": MappingProxyType(
            {
                **_STARTUP_READS,
                "hold": ("SELECT", "UPDATE"),
                "run": ("SELECT", "UPDATE"),
                "binding": ("SELECT",),
                "step": ("SELECT", "INSERT", "UPDATE"),
                "payload": ("SELECT", "INSERT", "DELETE"),
                "start_identity": ("SELECT", "DELETE"),
                "tombstone": ("SELECT", "INSERT"),
                "recovery_record": ("SELECT", "INSERT", "UPDATE"),
                "restore_snapshot": ("SELECT", "INSERT", "UPDATE"),
                "operator_action": ("SELECT", "INSERT"),
            }
        ),
        # The audit journal's key custody, per segment.
        "audit": MappingProxyType(
            {
                **_STARTUP_READS,
                "audit_segment": ("SELECT", "INSERT", "UPDATE"),
            }
        ),
    }
)
"""Component → table → privileges, exactly as they appear in the GRANT statements."""

SHARED_FUNCTIONS: Final = ("now()", "state_key_versions_in_use()")
"""Functions every component role may execute; all others are for triggers only."""


IDENTIFIER_MAX_BYTES: Final = 63


def component_role(namespace: str, component: str) -> str:
    """The role name of ``component`` in ``namespace`` (e.g. ``coordinator_prod_admission``)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}")
    namespace_identifier(namespace)  # refuses a name outside the pattern
    name = f"{namespace}_{component}"
    if len(name) <= IDENTIFIER_MAX_BYTES:
        return name
    # PostgreSQL would silently truncate the name, and two long namespaces could then share
    # roles; shorten the namespace part and keep it unique with a hash of the whole name.
    tag = hashlib.sha256(namespace.encode()).hexdigest()[:8]
    keep = IDENTIFIER_MAX_BYTES - len(component) - len(tag) - 2
    return f"{namespace[:keep]}_{tag}_{component}"


def component_roles(namespace: str) -> dict[str, str]:
    """Component → role name, for every component."""
    return {component: component_role(namespace, component) for component in COMPONENTS}


def grant_statements(namespace: str, runtime_role: str) -> list[str]:
    """The statements that reset the namespace's privileges to :data:`GRANTS`.

    The roles must exist and the objects of ``schema.sql`` be installed. Run by the schema
    owner inside apply's transaction.
    """
    ns = namespace_identifier(namespace)
    roles = component_roles(namespace)
    everyone = ", ".join(quote_ident(role) for role in roles.values())
    runtime = quote_ident(runtime_role)
    statements = [
        f"REVOKE ALL ON SCHEMA {ns} FROM PUBLIC, {runtime}, {everyone}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {ns} FROM PUBLIC, {runtime}, {everyone}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {ns} FROM PUBLIC, {runtime}, {everyone}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {ns} FROM PUBLIC, {runtime}, {everyone}",
        f"GRANT USAGE ON SCHEMA {ns} TO {everyone}",
        "GRANT EXECUTE ON FUNCTION "
        + ", ".join(f"{ns}.{function}" for function in SHARED_FUNCTIONS)
        + f" TO {everyone}",
    ]
    for component, tables in GRANTS.items():
        role = quote_ident(roles[component])
        for table, privileges in tables.items():
            statements.append(f"GRANT {', '.join(privileges)} ON {ns}.{table} TO {role}")
    for role in roles.values():
        # Membership without inheritance: the runtime role acts as a component only after
        # SET ROLE, so a leaked runtime session that has not chosen a role can read nothing.
        statements.append(f"GRANT {quote_ident(role)} TO {runtime} WITH INHERIT FALSE, SET TRUE")
    return statements


async def ensure_component_roles(conn: asyncpg.Connection, namespace: str) -> None:
    """Create the missing component roles as NOLOGIN; refuse one that could log in
    with more rights than it should (superuser, BYPASSRLS)."""
    q = load()
    for role in component_roles(namespace).values():
        row = await conn.fetchrow(q["role_attributes"], role)
        if row is None:
            await conn.execute(f"CREATE ROLE {quote_ident(role)} NOLOGIN NOINHERIT")
            continue
        if row["rolsuper"] or row["rolbypassrls"]:
            raise CoordinatorError(
                REFUSED, f"component role {role} exists with SUPERUSER or BYPASSRLS"
            )
        if row["rolcanlogin"]:
            await conn.execute(f"ALTER ROLE {quote_ident(role)} NOLOGIN")


async def grant_components(conn: asyncpg.Connection, namespace: str, runtime_role: str) -> None:
    """Reset the namespace's grants to :data:`GRANTS` (see :func:`grant_statements`)."""
    for statement in grant_statements(namespace, runtime_role):
        await conn.execute(statement)


# ----------------------------------------------------------------------- runtime role checks


def _refuse(reason: str) -> CoordinatorError:
    return CoordinatorError(REFUSED, f"runtime role: {reason}")


async def check_runtime_role_attributes(
    conn: asyncpg.Connection, runtime_role: str, migration_role: str | None
) -> None:
    """The checks that need no schema: the role exists and is not a superuser, has no
    BYPASSRLS, is not the migration role and is not a member of it."""
    q = load()
    row = await conn.fetchrow(q["role_attributes"], runtime_role)
    if row is None:
        raise _refuse(f"role {runtime_role} does not exist")
    if row["rolsuper"]:
        raise _refuse(f"{runtime_role} is a superuser")
    if row["rolbypassrls"]:
        raise _refuse(f"{runtime_role} has BYPASSRLS")
    if migration_role is None:
        return
    if runtime_role == migration_role:
        raise _refuse(f"{runtime_role} is the migration role")
    member = await conn.fetchval(q["role_is_member"], runtime_role, migration_role)
    if member:
        raise _refuse(f"{runtime_role} is a member of the migration role {migration_role}")


async def check_runtime_role_schema(
    conn: asyncpg.Connection, runtime_role: str, namespace: str, *, table_privileges: bool = True
) -> None:
    """The checks against an existing schema: the role neither owns it nor belongs to its
    owner, cannot CREATE in it, and (with ``table_privileges``) holds no table privilege
    there itself. Apply skips the last before it resets the grants, which removes them."""
    q = load()
    row = await conn.fetchrow(q["role_schema_rights"], runtime_role, namespace)
    if row is None:
        return
    if row["owns"]:
        raise _refuse(f"{runtime_role} owns the schema {namespace}")
    if row["member_of_owner"]:
        raise _refuse(
            f"{runtime_role} is a member of {row['owner']}, which owns the schema {namespace}"
        )
    if row["can_create"]:
        raise _refuse(f"{runtime_role} can CREATE in the schema {namespace}")
    if table_privileges and row["holds_table_privilege"]:
        raise _refuse(
            f"{runtime_role} holds table privileges in {namespace} itself "
            "(it must act only through the component roles)"
        )


async def check_component_membership(
    conn: asyncpg.Connection, runtime_role: str, namespace: str, components: Sequence[str]
) -> None:
    """Refuse when the runtime role may not SET ROLE to one of ``components``' roles."""
    q = load()
    for component in components:
        role = component_role(namespace, component)
        may_set = await conn.fetchval(q["role_may_set"], runtime_role, role)
        if not may_set:
            raise _refuse(f"{runtime_role} may not act as {role}; run apply with this role")


async def verify_runtime_role(
    conn: asyncpg.Connection, expected_role: str, namespace: str | None = None
) -> None:
    """Refuse (``deployment.refused``) a runtime connection whose login role breaks §6.2.

    ``conn`` is a connection made with the runtime URL (it may already have SET ROLE to a
    component role: the login role is what is judged). ``expected_role`` is
    ``deployment.runtimeRole``. With ``namespace``, the checks that need the schema run too;
    the schema's owner (the migration role) stands in for the migration role there.
    """
    session_user = await conn.fetchval("SELECT session_user::text")
    if session_user != expected_role:
        raise _refuse(
            f"the runtime URL logs in as {session_user}, "
            f"but deployment.runtimeRole is {expected_role}"
        )
    await check_runtime_role_attributes(conn, expected_role, None)
    if namespace is None:
        return
    info = await conn.fetchrow(load()["namespace_info"], namespace)
    if info is None:
        return
    await check_runtime_role_schema(conn, expected_role, namespace)
    await check_component_membership(conn, expected_role, namespace, COMPONENTS)


async def set_component_role(conn: asyncpg.Connection, namespace: str, component: str) -> None:
    """``SET ROLE`` to ``component``'s role; refuse when the runtime role was not granted it."""
    role = component_role(namespace, component)
    try:
        await conn.execute(f"SET ROLE {quote_ident(role)}")
    except (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedObjectError):
        raise _refuse(f"may not act as {role}; run apply with this runtime role") from None


__all__ = [
    "COMPONENTS",
    "GRANTS",
    "check_component_membership",
    "check_runtime_role_attributes",
    "check_runtime_role_schema",
    "component_role",
    "component_roles",
    "ensure_component_roles",
    "grant_components",
    "grant_statements",
    "set_component_role",
    "verify_runtime_role",
]
