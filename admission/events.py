"""Starting runs from signed events (CONTRACT §9.6), once the gateway verified the signature.

The gateway checks the ``registry-event-signature`` header against the event source's key
and hands over the source's name, the event ``id`` and its ``data``. Admission then starts
the source's workflow with ``data`` as the input, exactly as an API start would be judged
(recovery-only, active workflow, admission hold, input schema), under the start identity
derived from ``(source, id)``: a redelivered event finds the run it started before. The run
belongs to the principal ``(iss "event-source", sub <source>)`` and has no client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from admission.start import Admitter, parse_input
from core import derive
from core.callers import EVENT_ISSUER
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import StartResult, refuse_recovery_only

_EVENT_ID: Final = re.compile(r"[\x20-\x7e]{1,1024}")


@dataclass(frozen=True)
class EventCaller:
    """The principal of an event start: the event source, with no client identity."""

    iss: str
    sub: str
    client_id: str = ""


def check_event_id(event_id: str) -> None:
    """Refuse an event ``id`` that is empty, longer than 1024 or not printable ASCII."""
    if not _EVENT_ID.fullmatch(event_id):
        raise CoordinatorError(
            Code.REQUEST_INVALID, "/id: must be 1 to 1024 printable ASCII characters"
        )


class EventAdmitter:
    """Starts the runs of signed events for one deployment."""

    def __init__(self, admitter: Admitter, admission_key: bytes) -> None:
        self.admitter = admitter
        self._admission_key = admission_key

    @classmethod
    def from_admitter(cls, admitter: Admitter) -> EventAdmitter:
        """An event admitter sharing ``admitter``'s store, reading the admission key."""
        runtime = admitter.runtime
        key = runtime.resolver.read_key(runtime.config.deployment.admission_key_ref)
        return cls(admitter, key)

    async def start(self, source_key: str, event_id: str, data_json: str) -> StartResult:
        """Start (or find again) the run of event ``event_id`` from ``source_key``."""
        runtime = self.admitter.runtime
        refuse_recovery_only(runtime.recovery_only)
        source = runtime.config.event_sources.get(source_key)
        if source is None:
            # The gateway only passes sources it verified; a name this runtime file lacks
            # means the two disagree, and nothing may be started on that basis.
            raise CoordinatorError(
                Code.AUTHENTICATION_REFUSED, "the event source is not configured"
            )
        check_event_id(event_id)
        value = parse_input(data_json)
        identity = derive.event_start_identity(self._admission_key, source.source, event_id)
        caller = EventCaller(iss=EVENT_ISSUER, sub=source.source)
        return await self.admitter.start_identified(caller, source.workflow, identity, value)
