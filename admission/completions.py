"""Applying Casework review completion events (CONTRACT §9.5).

The gateway matched the event's bearer token and ``registry-recipient-binding`` header
with one connection's ``completion`` block and passes on that connection's name and the
``reviewId``. An event carries no decision and starts nothing: it only makes the next
read of the awaited result due now. The waiting step is found by its keyed digest of
(connection, result, review id) through a partial index — nothing is decrypted and no
other step is looked at — and the admission role may change nothing but the step's due
time and next check. Whether a step matched is never told to the caller (no oracle).
"""

from __future__ import annotations

import logging
import re
from typing import Final

from core import clock, derive
from core.codes import Code
from core.config.model import CASEWORK
from core.errors import CoordinatorError
from core.runtime import Runtime, Store

log = logging.getLogger("coordinator.admission")

REVIEW_DECISION: Final = "review-decision"
"""The result a completion event concerns."""

_REVIEW_ID: Final = re.compile(r"[\x21-\x7e]{1,256}")


def check_review_id(review_id: str) -> None:
    """Refuse a ``reviewId`` that is empty, longer than 256 or not visible ASCII."""
    if not _REVIEW_ID.fullmatch(review_id):
        raise CoordinatorError(
            Code.REQUEST_INVALID, "/reviewId: must be 1 to 256 visible ASCII characters"
        )


class CompletionWaker:
    """Brings waiting reads forward when Casework says a review was decided."""

    def __init__(self, runtime: Runtime, store: Store, admission_key: bytes) -> None:
        self.runtime = runtime
        self.store = store
        self._admission_key = admission_key

    @classmethod
    def from_runtime(cls, runtime: Runtime, store: Store) -> CompletionWaker:
        """A waker for ``runtime``, reading its admission key."""
        key = runtime.resolver.read_key(runtime.config.deployment.admission_key_ref)
        return cls(runtime, store, key)

    async def wake(self, connection: str, review_id: str) -> int:
        """Make the read of ``review_id``'s decision due now; answers how many steps woke.

        The caller (the gateway) answers 202 whatever this answers.
        """
        if self.runtime.recovery_only:
            raise CoordinatorError(
                Code.SERVICE_UNAVAILABLE, "this instance runs in recovery-only mode"
            )
        settings = self.runtime.config.connections.get(connection)
        if settings is None or settings.type != CASEWORK or settings.completion is None:
            # The gateway matched credentials of a connection this runtime file does not
            # accept events for: the two disagree, so nothing is woken.
            raise CoordinatorError(Code.AUTHENTICATION_REFUSED, "the completion is not accepted")
        check_review_id(review_id)
        match = derive.wait_match(self._admission_key, connection, REVIEW_DECISION, review_id)
        async with self.store.connection() as conn, conn.transaction():
            await clock.apply_to(conn)
            woken = await self.store.queries.waits_wake(conn, match=match)
        return len(woken)
