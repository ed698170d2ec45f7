"""Install and verify state schema version 4 in a deployment's namespace (CONTRACT §6.1).

``schema.sql`` is the single source of the layout, and ``transitions.sql`` of the functions
that carry out the dispatcher's step transitions. Installing runs both in the namespace;
every apply runs ``transitions.sql`` again (it only creates or replaces functions), so an
installed namespace gets the functions of the release that applies it. Verifying compares a
catalog dump of the installed namespace with the dump of a scratch namespace built from the
same files inside a savepoint that is rolled back, so anything added, dropped or altered by
hand (drift) is found without keeping a second description of the schema.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

import asyncpg

from core.codes import Code
from core.db import statements
from core.db.queries import PLACEHOLDER, render
from core.db.statements import Statements
from core.errors import CoordinatorError

SCHEMA_VERSION: Final = 4
SCHEMA_FILE: Final = Path(__file__).with_name("schema.sql")
TRANSITIONS_FILE: Final = Path(__file__).with_name("transitions.sql")
_DRIFT_SHOWN = 6


@cache
def schema_sql() -> str:
    """The text of ``schema.sql`` with its ``{{ns}}`` placeholders."""
    return SCHEMA_FILE.read_text("utf-8")


def render_schema(namespace: str) -> str:
    """``schema.sql`` for ``namespace``."""
    return render(schema_sql(), namespace)


@cache
def transitions_sql() -> str:
    """The text of ``transitions.sql`` with its ``{{ns}}`` placeholders."""
    return TRANSITIONS_FILE.read_text("utf-8")


def render_transitions(namespace: str) -> str:
    """``transitions.sql`` for ``namespace``."""
    return render(transitions_sql(), namespace)


@dataclass(frozen=True)
class NamespaceState:
    """What the catalog says about a namespace before anything reads its tables."""

    exists: bool
    """The schema exists."""
    owner: str | None
    """The role owning the schema."""
    has_objects: bool
    """The schema holds at least one table, function or type."""
    has_version_table: bool
    """The schema holds a ``schema_version`` table."""

    @property
    def empty(self) -> bool:
        """Nothing installed yet: apply may install version 4 here."""
        return not self.has_objects


async def inspect_namespace(conn: asyncpg.Connection, namespace: str) -> NamespaceState:
    """Look the namespace up in the catalog (any role may)."""
    row = await statements.namespace_info(conn, namespace=namespace)
    if row is None:
        return NamespaceState(False, None, False, False)
    return NamespaceState(True, row.owner, row.has_objects, row.has_version_table)


def refuse_unknown_layout(namespace: str) -> CoordinatorError:
    """The refusal for a namespace holding objects but no schema version."""
    return CoordinatorError(
        Code.DEPLOYMENT_REFUSED,
        f"namespace {namespace} holds objects but no schema version; "
        "it is not a Registry Coordinator schema",
    )


async def read_version(conn: asyncpg.Connection, namespace: str) -> int:
    """The version recorded in the namespace (needs SELECT on ``schema_version``)."""
    version = await Statements(namespace).schema_version_read(conn)
    if version is None:
        raise refuse_unknown_layout(namespace)
    return int(version)


def require_version(namespace: str, version: int) -> None:
    """Refuse any version but 4: an earlier layout with ``deployment.schema-too-old``."""
    if version < SCHEMA_VERSION:
        raise CoordinatorError(
            Code.DEPLOYMENT_SCHEMA_TOO_OLD,
            f"namespace {namespace} holds schema version {version}; version "
            f"{SCHEMA_VERSION} is required. Settle that work with its matching release, "
            "then use a fresh namespace and databaseId",
        )
    if version > SCHEMA_VERSION:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"namespace {namespace} holds schema version {version}, newer than this "
            f"release's {SCHEMA_VERSION}; use the release that installed it",
        )


async def install(conn: asyncpg.Connection, namespace: str) -> None:
    """Create the schema if missing and install version 4 in it (in the caller's
    transaction; the connected role becomes the owner of everything)."""
    await Statements(namespace).schema_create(conn)
    await conn.execute(render_schema(namespace))
    await conn.execute(render_transitions(namespace))


async def catalog_dump(conn: asyncpg.Connection, namespace: str) -> set[tuple[str, str, str]]:
    """Every object of ``namespace`` as (kind, name, definition), with the namespace's own
    name replaced by the placeholder so two namespaces can be compared: in definitions, and
    in the names of functions that take one of its types (``step_settle(...,
    p_settle {{ns}}.settle_args)``)."""
    rows = await statements.catalog_dump(conn, namespace=namespace)
    own_name = re.compile(r'(?<![A-Za-z0-9_"])"?' + re.escape(namespace) + r'"?(?![A-Za-z0-9_])')
    return {
        (
            row.kind,
            own_name.sub(PLACEHOLDER, row.name),
            own_name.sub(PLACEHOLDER, row.definition or ""),
        )
        for row in rows
    }


class _Rollback(Exception):
    """Raised inside a savepoint to roll it back."""


async def drift(conn: asyncpg.Connection, namespace: str) -> list[str]:
    """Differences between the installed namespace and ``schema.sql``, by object name."""
    installed = await catalog_dump(conn, namespace)
    expected = await scratch_dump(conn)
    return describe_drift(installed, expected)


async def scratch_dump(conn: asyncpg.Connection) -> set[tuple[str, str, str]]:
    """The catalog dump of ``schema.sql`` installed in a scratch namespace.

    The scratch namespace lives inside a savepoint that is always rolled back: nothing is
    left behind and no other session ever sees it. Needs CREATE on the database.
    """
    scratch = f"coordinator_scratch_{secrets.token_hex(8)}"
    dump: set[tuple[str, str, str]] = set()
    try:
        async with conn.transaction():
            await install(conn, scratch)
            dump = await catalog_dump(conn, scratch)
            raise _Rollback
    except _Rollback:
        pass
    return dump


def describe_drift(
    installed: set[tuple[str, str, str]], expected: set[tuple[str, str, str]]
) -> list[str]:
    """Human words for each differing object: missing, unexpected or different."""
    have = {(kind, name): definition for kind, name, definition in installed}
    want = {(kind, name): definition for kind, name, definition in expected}
    found: list[str] = []
    for kind, name in sorted(have.keys() | want.keys()):
        if (kind, name) not in have:
            found.append(f"{kind} {name} is missing")
        elif (kind, name) not in want:
            found.append(f"{kind} {name} is not part of version {SCHEMA_VERSION}")
        elif have[(kind, name)] != want[(kind, name)]:
            found.append(f"{kind} {name} differs")
    return found


async def ensure_schema(conn: asyncpg.Connection, namespace: str) -> bool:
    """Install version 4 in an empty namespace or verify an installed one.

    Runs as the migration role inside apply's transaction. Answers True when it installed.
    Refuses an earlier layout (``deployment.schema-too-old``), a later or unknown one, a
    schema owned by another role, and drift (``deployment.refused``).
    """
    state = await inspect_namespace(conn, namespace)
    me = await statements.current_user_name(conn)
    if state.exists and state.owner != me:
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"schema {namespace} is owned by {state.owner}, not by the migration role {me}",
        )
    if state.empty:
        await install(conn, namespace)
        return True
    if not state.has_version_table:
        raise refuse_unknown_layout(namespace)
    require_version(namespace, await read_version(conn, namespace))
    # The functions are the release's own: an earlier release's are replaced, not refused.
    await conn.execute(render_transitions(namespace))
    differences = await drift(conn, namespace)
    if differences:
        shown = "; ".join(differences[:_DRIFT_SHOWN])
        more = len(differences) - _DRIFT_SHOWN
        tail = f"; and {more} more" if more > 0 else ""
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"schema {namespace} differs from version {SCHEMA_VERSION}: {shown}{tail}",
        )
    return False
