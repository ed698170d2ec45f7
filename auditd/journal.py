"""The audit journal: an append-only, hash-chained JSON Lines file (CONTRACT §12).

Each line is one record, serialized compactly with a fixed key order::

    {"seq":N,"at":"…Z","action":"…","outcome":"…","principalRef":…,"clientRef":…,
     "runRef":"…","reason":"…","prev":"<64 hex>"}

``runRef`` and ``reason`` appear only when set. ``prev`` is the SHA-256 of the previous
line's bytes (without its newline), 64 zeros on the first line, so removing, editing or
reordering a line breaks the chain at the next line. The ``*Ref`` values are keyed
references: HMAC-SHA-256 under the audit key, hex, cut to 32 characters. Without the key
they cannot be joined to a client, principal or run, and a new audit key starts references
that do not join the earlier ones.

Segments: the first record written under an audit key is an ``audit-key.segment`` record
whose ``reason`` is ``fingerprint:<custody fingerprint of the key>``; the journal writes one
when the file is new and whenever it is opened with a key whose fingerprint differs from
the last segment's (``outcome`` ``started`` or ``changed``). The fingerprint identifies the
key without revealing it (CONTRACT §7.4).

Durability: :meth:`Journal.append` returns only after the lines are written and fsynced.
Writes run in a worker thread. Appends that arrive while a write is in flight wait and go
out together in the next write with one fsync (group commit). After a failed write or fsync
the journal is no longer ready; every later append is refused with
``audit.response-unavailable`` until the service reopens the file, because what reached the
disk is unknown.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final

from core.clock import timestamp
from core.codes import Code
from core.errors import CoordinatorError
from core.keys import fingerprint

GENESIS_PREV: Final = "0" * 64
REF_LENGTH: Final = 32
KEY_BYTES: Final = 32

SEGMENT_ACTION: Final = "audit-key.segment"
SEGMENT_STARTED: Final = "started"
SEGMENT_CHANGED: Final = "changed"
FINGERPRINT_PREFIX: Final = "fingerprint:"

RECORD_KEYS: Final = (
    "seq",
    "at",
    "action",
    "outcome",
    "principalRef",
    "clientRef",
    "runRef",
    "reason",
    "prev",
)
"""Every key a record may carry, in serialization order."""
OPTIONAL_KEYS: Final = frozenset({"runRef", "reason"})

_WORD = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*")
_REASON = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


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


def serialize(record: dict[str, Any]) -> bytes:
    """The canonical line bytes of a record (no newline): fixed key order, compact, ASCII."""
    ordered = {}
    for name in RECORD_KEYS:
        if name in record:
            ordered[name] = record[name]
        elif name not in OPTIONAL_KEYS:
            raise ValueError(f"audit record lacks {name}")
    if len(ordered) != len(record):
        raise ValueError("audit record has unknown keys")
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def line_hash(line: bytes) -> str:
    """The ``prev`` value of the line following ``line``."""
    return hashlib.sha256(line).hexdigest()


def _default_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class JournalTail:
    """What :func:`read_tail` learned from an existing journal file."""

    last_seq: int
    """``seq`` of the last line (0 for an empty file)."""
    prev: str
    """Hash of the last line (the genesis value for an empty file)."""
    segment_fingerprint: str | None
    """Fingerprint named by the last segment record, if the file has one."""


def read_tail(path: Path) -> JournalTail:
    """Scan an existing journal for its last line and its last segment record.

    Refuses (``audit.journal-broken``, naming the file and line) when the last line is not
    complete, is not a record, or a segment record cannot be read. It does not verify the
    whole chain: ``python -m auditd.verify`` does that.
    """
    with path.open("rb") as handle:
        return _scan(handle, path)


def _scan(handle: BinaryIO, path: Path) -> JournalTail:
    last: bytes | None = None
    number = 0
    segment: str | None = None
    marker = f'"action":"{SEGMENT_ACTION}"'.encode("ascii")
    for raw in handle:
        number += 1
        if not raw.endswith(b"\n"):
            raise CoordinatorError(
                Code.AUDIT_JOURNAL_BROKEN, f"{path}: line {number}: the last line is incomplete"
            )
        last = raw[:-1]
        if marker in last:
            segment = _segment_fingerprint(path, number, last)
    if last is None:
        return JournalTail(last_seq=0, prev=GENESIS_PREV, segment_fingerprint=None)
    record = _parse(path, number, last)
    seq = record.get("seq")
    prev = record.get("prev")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN, f"{path}: line {number}: seq is not valid"
        )
    if not isinstance(prev, str) or not _HEX64.fullmatch(prev):
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN, f"{path}: line {number}: prev is not valid"
        )
    return JournalTail(last_seq=seq, prev=line_hash(last), segment_fingerprint=segment)


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN, f"{path}: line {number}: not a JSON record"
        ) from None
    if not isinstance(record, dict):
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN, f"{path}: line {number}: not a JSON record"
        )
    return record


def _segment_fingerprint(path: Path, number: int, line: bytes) -> str:
    record = _parse(path, number, line)
    reason = record.get("reason")
    if (
        record.get("action") != SEGMENT_ACTION
        or not isinstance(reason, str)
        or not reason.startswith(FINGERPRINT_PREFIX)
    ):
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN,
            f"{path}: line {number}: segment record without a fingerprint",
        )
    return reason[len(FINGERPRINT_PREFIX) :]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


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
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._key = audit_key
        self._seq = tail.last_seq
        self._prev = tail.prev
        self._clock = clock
        self._fsync = fsync
        self._ready = True
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
    ) -> Journal:
        """Open (or create, mode 0600) the journal at ``path`` and resume its chain.

        Writes a segment record when the file is new or the audit key changed. Raises
        ``audit.journal-broken`` when the existing last line cannot be continued.
        """
        if len(audit_key) != KEY_BYTES:
            raise ValueError(f"the audit key must be {KEY_BYTES} bytes")
        fd, tail = await asyncio.to_thread(_open_file, path, fsync)
        journal = cls(path, fd, audit_key, tail, clock, fsync)
        try:
            if tail.segment_fingerprint != journal.key_fingerprint:
                outcome = SEGMENT_CHANGED if tail.last_seq else SEGMENT_STARTED
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
        """False once a write or fsync failed (or after close): appends are refused."""
        return self._ready and self._fd is not None

    @property
    def last_seq(self) -> int:
        """``seq`` of the last record known to be on disk."""
        return self._seq

    async def append(self, entries: Sequence[AuditEntry]) -> list[int]:
        """Write ``entries`` as consecutive records and fsync; returns their ``seq`` values.

        Raises ``audit.response-unavailable`` when the journal is not ready or the write
        fails; the caller then withholds the action's answer.
        """
        if not entries:
            return []
        if not self.ready:
            raise _unavailable()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(list(entries), future))
        if self._writer is None or self._writer.done():
            # A task, not an inline await: appends made before it first runs join its batch.
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def close(self) -> None:
        """Finish in-flight writes and close the file; later appends are refused."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            await asyncio.to_thread(os.close, fd)

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            if not self.ready:
                _fail(batch)
                continue
            try:
                data, seq, prev, results = self._render(batch)
            except Exception as exc:  # a bad clock value: refuse this batch, keep the file
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            fd = self._fd
            assert fd is not None  # ready implies open
            try:
                await asyncio.to_thread(self._write_and_sync, fd, data)
            except Exception:
                # What reached the disk is unknown: stop here, never guess a seq again.
                self._ready = False
                _fail(batch)
                continue
            self._seq, self._prev = seq, prev
            for pending, seqs in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(seqs)

    def _render(self, batch: Sequence[_Pending]) -> tuple[bytes, int, str, list[list[int]]]:
        lines: list[bytes] = []
        seq, prev = self._seq, self._prev
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

    def _write_and_sync(self, fd: int, data: bytes) -> None:
        _write_all(fd, data)
        self._fsync(fd)

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
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CoordinatorError(Code.AUDIT_JOURNAL_BROKEN, f"{path}: not a regular file")
        # Read through the descriptor we will append to, so the file judged is the file
        # written even if the path is replaced meanwhile. O_APPEND ignores the offset.
        with os.fdopen(os.dup(fd), "rb") as handle:
            handle.seek(0)
            tail = _scan(handle, path)
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
