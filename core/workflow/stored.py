"""Workflow definitions as the database stores them, parsed once per package digest.

A run keeps the digest it was admitted under; its definition comes from the ``package``
table, never from the package folder, so a run keeps its definition after an upgrade.
"""

from __future__ import annotations

import asyncio

import asyncpg

from core.codes import Code
from core.db.statements import Statements
from core.errors import CoordinatorError
from core.workflow.check import check_source
from core.workflow.model import Workflow


class WorkflowCache:
    """Workflow definitions by package digest, each parsed once from the stored source."""

    def __init__(self) -> None:
        self._parsed: dict[str, Workflow] = {}
        self._lock = asyncio.Lock()

    def cached(self, digest: str) -> Workflow | None:
        """The definition of ``digest`` if it was read already (no database needed)."""
        return self._parsed.get(digest)

    async def get(self, conn: asyncpg.Connection, queries: Statements, digest: str) -> Workflow:
        """The definition of ``digest``, read from the ``package`` table the first time."""
        found = self._parsed.get(digest)
        if found is not None:
            return found
        async with self._lock:
            found = self._parsed.get(digest)
            if found is None:
                row = await queries.package_read(conn, digest=digest)
                if row is None:
                    raise CoordinatorError(
                        Code.DEPLOYMENT_REFUSED, f"package {digest} is not stored in the database"
                    )
                # The source was checked when the package was built and when it was
                # applied; checking again here costs little once per digest and keeps a
                # tampered row from running half-understood.
                found = check_source(row.source)
                self._parsed[digest] = found
        return found
