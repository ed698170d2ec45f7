"""The audit journal's writer: auditd appends every record through it (CONTRACT §12).

The file it writes, an append-only, hash-chained JSON Lines file of keyed references, is
described in :mod:`core.audit.format`, beside the reading side and the opening checks,
which ``coordinatorctl audit verify`` and ``audit seal-tail`` use too. This module adds what
only the writer does: the keyed references, the segment record at open, and the appends.

Durability: :meth:`Journal.append` returns only after the lines are written and fsynced.
Writes run in a worker thread. Appends that arrive while a write is in flight wait and go
out together in the next write with one fsync (group commit).

A failed write or fsync refuses its batch with ``audit.response-unavailable`` and leaves the
journal not ready, but not for good: the journal remembers the file's length after its last
good fsync, and the next attempt (the next append, or :meth:`Journal.recover`, which auditd's
health check calls) first cuts the file back to that length, so no partial line or unsynced
record of the failed batch stays in the chain, then writes an ``audit-journal.write-failed``
record (``outcome`` ``recovered``, ``reason`` ``refused:<records refused meanwhile>``) ahead
of whatever it has to write, and fsyncs. Once that succeeds the journal is ready again.

The file is opened with :func:`~core.audit.format.open_locked` and stays under its lock until
:meth:`Journal.close`. A torn last line is never appended to: opening refuses with
:class:`~core.audit.format.TornTail` until the operator seals it with ``coordinatorctl audit
seal-tail`` (:mod:`core.audit.seal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from core.audit.format import (
    FINGERPRINT_PREFIX,
    RECOVERED,
    RECOVERY_ACTION,
    REF_LENGTH,
    REFUSED_PREFIX,
    SEGMENT_ACTION,
    SEGMENT_CHANGED,
    SEGMENT_STARTED,
    JournalTail,
    TornTail,
    line_hash,
    open_locked,
    scan,
    serialize,
)
from core.clock import timestamp
from core.codes import Code
from core.errors import CoordinatorError
from core.keys import fingerprint
from core.logs import NOTICE

log = logging.getLogger("coordinator.auditd")

KEY_BYTES: Final = 32
"""The audit key's length in bytes."""

_WORD = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*")
_REASON = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


@dataclass(frozen=True)
class AuditEntry:
    """What a caller asks to record; the journal turns raw identities into keyed refs."""

    action: str
    """What was attempted, e.g. ``start``, ``cancel``, ``restore-hold``, ``admission-hold``."""
    outcome: str
    """How it ended, e.g. ``accepted``, ``refused``, ``not-found``."""
    principal: tuple[str, str] | None = None
    """The caller's verified ``(iss, sub)``; ``None`` when there is no caller."""
    client_id: str | None = None
    """The caller's verified ``client_id``; ``None`` when there is no caller."""
    run_id: str | None = None
    """The run acted on, if any."""
    reason: str | None = None
    """The operator's investigation reference: 1–128 of ``[A-Za-z0-9._:/-]``."""

    def __post_init__(self) -> None:
        # These are written verbatim, so they must be words from the code, never caller text.
        if not _WORD.fullmatch(self.action):
            raise ValueError("audit action must be a lowercase dotted word")
        if not _WORD.fullmatch(self.outcome):
            raise ValueError("audit outcome must be a lowercase dotted word")
        if self.reason is not None and not _REASON.fullmatch(self.reason):
            raise ValueError("audit reason must be an investigation reference")


def keyed_ref(audit_key: bytes, value: str) -> str:
    """HMAC-SHA-256(audit key, value) as hex, cut to 32 characters."""
    return hmac.new(audit_key, value.encode("utf-8"), hashlib.sha256).hexdigest()[:REF_LENGTH]


def principal_value(iss: str, sub: str) -> str:
    """The text a ``principalRef`` is computed from."""
    return f"{iss}\n{sub}"


def _default_clock() -> datetime:
    return datetime.now(UTC)


Write = Callable[[int, bytes], int]
"""``os.write``'s shape: write some bytes to a descriptor, return how many were written."""


def _write_all(write: Write, fd: int, data: bytes) -> None:
    offset = 0
    while offset < len(data):
        written = write(fd, data[offset:])
        if written <= 0:  # a regular file never does this; never spin on it
            raise OSError(errno.EIO, "the write made no progress")
        offset += written


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@dataclass
class _Pending:
    entries: Sequence[AuditEntry]
    future: asyncio.Future[list[int]]


class Journal:
    """An open audit journal; create it with :meth:`open` inside the running event loop."""

    def __init__(
        self,
        path: Path,
        fd: int,
        audit_key: bytes,
        tail: JournalTail,
        clock: Callable[[], datetime],
        fsync: Callable[[int], None],
        write: Write = os.write,
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._key = audit_key
        self._seq = tail.last_seq
        self._prev = tail.prev
        self._end = tail.end
        self._clock = clock
        self._fsync = fsync
        self._write = write
        self._failed = False
        self._refused = 0
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self.key_fingerprint = fingerprint(audit_key)
        """Custody fingerprint of the audit key this journal writes under."""
        self.segment_start_seq: int | None = None
        """``seq`` of the segment record written at open, if one was (new file or new key)."""

    @classmethod
    async def open(
        cls,
        path: Path,
        audit_key: bytes,
        *,
        clock: Callable[[], datetime] = _default_clock,
        fsync: Callable[[int], None] = os.fsync,
        write: Write = os.write,
    ) -> Journal:
        """Open (or create, mode 0600) the journal at ``path`` and resume its chain.

        Writes a segment record when the file is new or the audit key changed. Raises
        :class:`TornTail` or ``audit.journal-broken`` when the existing last line cannot be
        continued, ``audit.journal-insecure`` for a symbolic link or a file group or others
        may use, and ``audit.journal-locked`` while another process holds the file.
        ``write`` and ``fsync`` are the disk, injectable so tests can make it fail.
        """
        if len(audit_key) != KEY_BYTES:
            raise ValueError(f"the audit key must be {KEY_BYTES} bytes")
        fd, tail = await asyncio.to_thread(_open_file, path, fsync)
        journal = cls(path, fd, audit_key, tail, clock, fsync, write)
        try:
            if tail.segment_fingerprint != journal.key_fingerprint:
                # "started" opens the first segment (a new file, or one whose only record
                # seals a torn first line); "changed" follows a segment under another key.
                started = tail.segment_fingerprint is None
                outcome = SEGMENT_STARTED if started else SEGMENT_CHANGED
                seqs = await journal.append(
                    [
                        AuditEntry(
                            action=SEGMENT_ACTION,
                            outcome=outcome,
                            reason=FINGERPRINT_PREFIX + journal.key_fingerprint,
                        )
                    ]
                )
                journal.segment_start_seq = seqs[0]
        except BaseException:
            await journal.close()
            raise
        return journal

    @property
    def ready(self) -> bool:
        """False while the last write or fsync has failed, and after close."""
        return not self._failed and self._fd is not None

    @property
    def last_seq(self) -> int:
        """``seq`` of the last record known to be on disk."""
        return self._seq

    async def append(self, entries: Sequence[AuditEntry]) -> list[int]:
        """Write ``entries`` as consecutive records and fsync; returns their ``seq`` values.

        Raises ``audit.response-unavailable`` when the journal is closed or the write fails;
        the caller then withholds the action's answer. After a failure the next append
        tries the disk again (see the module's notes).
        """
        if not entries:
            return []
        return await self._submit(list(entries))

    async def recover(self) -> bool:
        """After a failed write, try the disk again now; True when the journal takes records.

        Writes nothing while the journal is healthy. Meant for the health check, so the
        journal becomes ready again when the disk does even if no action arrives.
        """
        if self._failed and self._fd is not None:
            with contextlib.suppress(CoordinatorError):
                await self._submit([])
        return self.ready

    async def close(self) -> None:
        """Finish in-flight writes and close the file; later appends are refused.

        If the last write failed, the file is first cut back to its last good length, so a
        partial line is not left for the next start to refuse.
        """
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            await asyncio.to_thread(self._close_file, fd, self._end if self._failed else None)

    async def _submit(self, entries: Sequence[AuditEntry]) -> list[int]:
        if self._fd is None:
            raise _unavailable()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(entries, future))
        if self._writer is None or self._writer.done():
            # A task, not an inline await: appends made before it first runs join its batch.
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            fd = self._fd
            if fd is None:
                _fail(batch)
                continue
            healing = self._failed
            try:
                data, seq, prev, results = self._render(batch, healing)
            except Exception as exc:  # a bad clock value: refuse this batch, keep the file
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            if data:
                try:
                    cut_to = self._end if healing else None
                    await asyncio.to_thread(self._write_and_sync, fd, data, cut_to)
                except Exception as exc:
                    if not self._failed:
                        log.error(
                            "audit journal write failed (%s): records are refused with %s "
                            "until a write succeeds",
                            _why(exc),
                            Code.AUDIT_RESPONSE_UNAVAILABLE.value,
                        )
                    self._failed = True
                    self._refused += sum(len(pending.entries) for pending in batch)
                    _fail(batch)
                    continue
                if healing:
                    log.log(
                        NOTICE,
                        "audit journal writable again; %d records were refused meanwhile",
                        self._refused,
                    )
                self._failed, self._refused = False, 0
                self._seq, self._prev, self._end = seq, prev, self._end + len(data)
            for pending, seqs in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(seqs)

    def _render(
        self, batch: Sequence[_Pending], healing: bool
    ) -> tuple[bytes, int, str, list[list[int]]]:
        lines: list[bytes] = []
        seq, prev = self._seq, self._prev
        if healing:
            # The first record after a failure says how many were refused meanwhile.
            seq += 1
            entry = AuditEntry(
                action=RECOVERY_ACTION, outcome=RECOVERED, reason=f"{REFUSED_PREFIX}{self._refused}"
            )
            line = serialize(self._record(entry, seq, prev))
            prev = line_hash(line)
            lines.append(line)
        results: list[list[int]] = []
        for pending in batch:
            seqs = []
            for entry in pending.entries:
                seq += 1
                line = serialize(self._record(entry, seq, prev))
                prev = line_hash(line)
                lines.append(line)
                seqs.append(seq)
            results.append(seqs)
        return b"".join(line + b"\n" for line in lines), seq, prev, results

    def _write_and_sync(self, fd: int, data: bytes, cut_to: int | None) -> None:
        if cut_to is not None:
            # Whatever the failed write left after the last good record goes: a partial
            # line, or whole lines whose fsync failed (their callers were refused).
            os.ftruncate(fd, cut_to)
        _write_all(self._write, fd, data)
        self._fsync(fd)

    def _close_file(self, fd: int, cut_to: int | None) -> None:
        try:
            if cut_to is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, cut_to)
                    self._fsync(fd)
        finally:
            os.close(fd)

    def _record(self, entry: AuditEntry, seq: int, prev: str) -> dict[str, Any]:
        record: dict[str, Any] = {
            "seq": seq,
            "at": timestamp(self._clock()),
            "action": entry.action,
            "outcome": entry.outcome,
            "principalRef": (
                keyed_ref(self._key, principal_value(*entry.principal))
                if entry.principal is not None
                else None
            ),
            "clientRef": (
                keyed_ref(self._key, entry.client_id) if entry.client_id is not None else None
            ),
        }
        if entry.run_id is not None:
            record["runRef"] = keyed_ref(self._key, entry.run_id)
        if entry.reason is not None:
            record["reason"] = entry.reason
        record["prev"] = prev
        return record


def _unavailable() -> CoordinatorError:
    return CoordinatorError(Code.AUDIT_RESPONSE_UNAVAILABLE, "the audit journal cannot be written")


def _fail(batch: Sequence[_Pending]) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(_unavailable())


def _open_file(path: Path, fsync: Callable[[int], None]) -> tuple[int, JournalTail]:
    created = not os.path.lexists(path)
    fd = open_locked(path, os.O_APPEND | os.O_CREAT)
    try:
        # Read through the descriptor we will append to, so the file judged is the file
        # written even if the path is replaced meanwhile. O_APPEND ignores the offset.
        with os.fdopen(os.dup(fd), "rb") as handle:
            handle.seek(0)
            tail, torn = scan(handle, path)
        if torn is not None:
            raise TornTail(path, torn)
        if created:
            # Make the new file's directory entry durable too, not only its contents.
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, tail
