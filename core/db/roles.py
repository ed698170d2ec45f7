"""Component roles, their grants, and the checks on the runtime role (CONTRACT §6.2, §6.3).

Each database-using component acts as its own NOLOGIN role, ``<namespace>_admission``,
``_dispatcher``, ``_recovery`` and ``_audit``. The runtime login role is a member of each
with ``INHERIT FALSE, SET TRUE``: it holds no privilege of its own, and a component's
connections ``SET ROLE`` to the component's role right after connecting. What each role may
do is written out in the ``grants_reset`` query (``core/db/queries/apply.sql``) and read
back here as :data:`GRANTS`; ``apply`` revokes everything in the namespace from these roles
and runs those grants again, so re-running apply also repairs grants someone widened by hand.

The runtime role checks refuse, with ``deployment.refused``, a login role that could reach
past those grants: a superuser, a role with BYPASSRLS, a member of the migration role (or
of whichever role owns the schema), the owner of the schema, a role that can CREATE in it,
or one that holds table privileges there itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

import asyncpg

from core.codes import Code
from core.db import statements
from core.db.queries import namespace_identifier, query_text, without_comments
from core.db.statements import Statements
from core.errors import CoordinatorError

COMPONENTS: Final = ("admission", "dispatcher", "recovery", "audit")
"""The components that use the database, in the order their roles are made."""

# One GRANT of privileges on tables of the namespace to component roles, whitespace folded.
_TABLE_GRANT: Final = re.compile(
    r"GRANT (?P<privileges>.+?) ON (?P<tables>\{\{ns\}\}\.\w+(?:, \{\{ns\}\}\.\w+)*)"
    r" TO (?P<roles>\{\{\w+\}\}(?:, \{\{\w+\}\})*)"
)
_PRIVILEGE: Final = re.compile(r"[A-Z]+(?: \([a-z_, ]+\))?")
_ROLE_WORD: Final = re.compile(r"\{\{(\w+)\}\}")


def _read_grants(sql: str) -> Mapping[str, Mapping[str, tuple[str, ...]]]:
    """The table grants of ``sql``: component → table → privileges, in the order written."""
    grants: dict[str, dict[str, list[str]]] = {component: {} for component in COMPONENTS}
    for statement in without_comments(sql).split(";"):
        grant = _TABLE_GRANT.fullmatch(" ".join(statement.split()))
        if grant is None:
            continue
        privileges = _PRIVILEGE.findall(grant["privileges"])
        for component in _ROLE_WORD.findall(grant["roles"]):
            for table in grant["tables"].split(", "):
                held = grants[component].setdefault(table.removeprefix("{{ns}}."), [])
                held += [privilege for privilege in privileges if privilege not in held]
    return MappingProxyType(
        {
            component: MappingProxyType({table: tuple(held) for table, held in tables.items()})
            for component, tables in grants.items()
        }
    )


GRANTS: Final = _read_grants(query_text("grants_reset"))
"""Component → table → privileges, as the ``grants_reset`` query grants them (read back
from its text, so this table and what apply grants cannot differ)."""


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


async def ensure_component_roles(conn: asyncpg.Connection, namespace: str) -> None:
    """Create the missing component roles as NOLOGIN; refuse one that could log in
    with more rights than it should (superuser, BYPASSRLS)."""
    queries = Statements(namespace)
    for role in component_roles(namespace).values():
        row = await statements.role_attributes(conn, role=role)
        if row is None:
            await queries.role_create(conn, role=role)
            continue
        if row.rolsuper or row.rolbypassrls:
            raise CoordinatorError(
                Code.DEPLOYMENT_REFUSED, f"component role {role} exists with SUPERUSER or BYPASSRLS"
            )
        if row.rolcanlogin:
            await queries.role_nologin(conn, role=role)


async def grant_components(conn: asyncpg.Connection, namespace: str, runtime_role: str) -> None:
    """Reset the namespace's privileges to :data:`GRANTS` and make ``runtime_role`` a member
    of every component role (the ``grants_reset`` query).

    The roles must exist and the objects of ``schema.sql`` be installed. Run by the schema
    owner inside apply's transaction.
    """
    roles = component_roles(namespace)
    await Statements(namespace).grants_reset(
        conn,
        runtime=runtime_role,
        admission=roles["admission"],
        dispatcher=roles["dispatcher"],
        recovery=roles["recovery"],
        audit=roles["audit"],
    )


# ----------------------------------------------------------------------- runtime role checks


def _refuse(reason: str) -> CoordinatorError:
    return CoordinatorError(Code.DEPLOYMENT_REFUSED, f"runtime role: {reason}")


async def check_runtime_role_attributes(
    conn: asyncpg.Connection, runtime_role: str, migration_role: str | None
) -> None:
    """The checks that need no schema: the role exists and is not a superuser, has no
    BYPASSRLS, is not the migration role and is not a member of it."""
    row = await statements.role_attributes(conn, role=runtime_role)
    if row is None:
        raise _refuse(f"role {runtime_role} does not exist")
    if row.rolsuper:
        raise _refuse(f"{runtime_role} is a superuser")
    if row.rolbypassrls:
        raise _refuse(f"{runtime_role} has BYPASSRLS")
    if migration_role is None:
        return
    if runtime_role == migration_role:
        raise _refuse(f"{runtime_role} is the migration role")
    member = await statements.role_is_member(conn, member=runtime_role, role=migration_role)
    if member:
        raise _refuse(f"{runtime_role} is a member of the migration role {migration_role}")


async def check_runtime_role_schema(
    conn: asyncpg.Connection, runtime_role: str, namespace: str, *, table_privileges: bool = True
) -> None:
    """The checks against an existing schema: the role neither owns it nor belongs to its
    owner, cannot CREATE in it, and (with ``table_privileges``) holds no table privilege
    there itself. Apply skips the last before it resets the grants, which removes them."""
    row = await statements.role_schema_rights(conn, role=runtime_role, namespace=namespace)
    if row is None:
        return
    if row.owns:
        raise _refuse(f"{runtime_role} owns the schema {namespace}")
    if row.member_of_owner:
        raise _refuse(
            f"{runtime_role} is a member of {row.owner}, which owns the schema {namespace}"
        )
    if row.can_create:
        raise _refuse(f"{runtime_role} can CREATE in the schema {namespace}")
    if table_privileges and row.holds_table_privilege:
        raise _refuse(
            f"{runtime_role} holds table privileges in {namespace} itself "
            "(it must act only through the component roles)"
        )


async def check_component_membership(
    conn: asyncpg.Connection, runtime_role: str, namespace: str, components: Sequence[str]
) -> None:
    """Refuse when the runtime role may not SET ROLE to one of ``components``' roles."""
    for component in components:
        role = component_role(namespace, component)
        may_set = await statements.role_may_set(conn, member=runtime_role, role=role)
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
    session_user = await statements.session_user_name(conn)
    if session_user != expected_role:
        raise _refuse(
            f"the runtime URL logs in as {session_user}, "
            f"but deployment.runtimeRole is {expected_role}"
        )
    await check_runtime_role_attributes(conn, expected_role, None)
    if namespace is None:
        return
    info = await statements.namespace_info(conn, namespace=namespace)
    if info is None:
        return
    await check_runtime_role_schema(conn, expected_role, namespace)
    await check_component_membership(conn, expected_role, namespace, COMPONENTS)


async def set_component_role(conn: asyncpg.Connection, namespace: str, component: str) -> None:
    """``SET ROLE`` to ``component``'s role; refuse when the runtime role was not granted it."""
    role = component_role(namespace, component)
    try:
        await statements.role_set(conn, role=role)
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
    "set_component_role",
    "verify_runtime_role",
]
