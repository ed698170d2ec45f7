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
out together in the next write with one fsync (group commit).

A failed write or fsync refuses its batch with ``audit.response-unavailable`` and leaves the
journal not ready, but not for good: the journal remembers the file's length after its last
good fsync, and the next attempt (the next append, or :meth:`Journal.recover`, which auditd's
health check calls) first cuts the file back to that length, so no partial line or unsynced
record of the failed batch stays in the chain, then writes an ``audit-journal.write-failed``
record (``outcome`` ``recovered``, ``reason`` ``refused:<records refused meanwhile>``) ahead
of whatever it has to write, and fsyncs. Once that succeeds the journal is ready again.

Safety of the file: it is opened with ``O_NOFOLLOW`` (a symbolic link is refused, never
followed), must be a regular file that group and others have no access to
(``audit.journal-insecure``; it is refused, not repaired, because a file others could write
may already hold lines nobody in this process wrote), and is held under an exclusive
``flock`` for as long as it is open: a second writer, another auditd or
``coordinatorctl audit seal-tail``, is refused with ``audit.journal-locked`` instead of
interleaving lines with the first and breaking the chain.

A torn last line (a write cut short by a full disk or a crash: no newline, or not a record)
is never appended to: opening refuses with :class:`TornTail` until the operator seals it
with ``coordinatorctl audit seal-tail`` (:mod:`auditd.seal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import logging
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
from core.logs import NOTICE

log = logging.getLogger("coordinator.auditd")

GENESIS_PREV: Final = "0" * 64
REF_LENGTH: Final = 32
KEY_BYTES: Final = 32

SEGMENT_ACTION: Final = "audit-key.segment"
SEGMENT_STARTED: Final = "started"
SEGMENT_CHANGED: Final = "changed"
FINGERPRINT_PREFIX: Final = "fingerprint:"

RECOVERY_ACTION: Final = "audit-journal.write-failed"
"""The first record written after a failed write or fsync (``outcome`` ``recovered``)."""
RECOVERED: Final = "recovered"
REFUSED_PREFIX: Final = "refused:"
"""``reason`` of a recovery record: ``refused:<records refused while the journal failed>``."""
SEAL_ACTION: Final = "audit-journal.torn-tail"
"""The record ``coordinatorctl audit seal-tail`` writes after moving a torn line aside."""
SEALED: Final = "sealed"

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
    """``seq`` of the last complete record (0 for an empty file)."""
    prev: str
    """Hash of that record's line (the genesis value for an empty file)."""
    segment_fingerprint: str | None
    """Fingerprint named by the last segment record, if the file has one."""
    end: int
    """Length in bytes of the part that can be continued: the whole file unless it is torn."""


@dataclass(frozen=True)
class TornPart:
    """A last line cut short: everything from ``start`` to the end of the file."""

    line: int
    """1-based number of the torn line."""
    start: int
    """Byte offset where it starts (the length of the good part before it)."""
    length: int
    """How many bytes it has."""
    why: str
    """What is wrong with it, in words: it has no newline, or it is not a record."""


class TornTail(CoordinatorError):
    """The journal's last line is torn: it can be sealed (:mod:`auditd.seal`), not continued."""

    def __init__(self, path: Path, torn: TornPart) -> None:
        super().__init__(
            Code.AUDIT_JOURNAL_BROKEN,
            f"{path}: line {torn.line} is torn ({torn.length} bytes {torn.why})",
        )
        self.torn = torn


def read_tail(path: Path) -> JournalTail:
    """Scan an existing journal for its last line and its last segment record.

    Refuses with :class:`TornTail` when the last line is incomplete or not a JSON object,
    and with ``audit.journal-broken`` (naming the file and line) when the last complete
    record or the segment record in force cannot be read. It does not verify the whole
    chain: ``coordinatorctl audit verify`` does that.
    """
    with path.open("rb") as handle:
        tail, torn = scan(handle, path)
    if torn is not None:
        raise TornTail(path, torn)
    return tail


def scan(handle: BinaryIO, path: Path) -> tuple[JournalTail, TornPart | None]:
    """Read a journal from its start: the tail to continue from, and a torn last line if any.

    Only the last line may be torn; the record before it (or the last record, when nothing
    is torn) must have a valid ``seq`` and ``prev``, or ``audit.journal-broken`` is raised.
    """
    marker = f'"action":"{SEGMENT_ACTION}"'.encode("ascii")
    # The last two segment lines seen: the newest may be the torn line itself.
    segments: list[tuple[int, bytes]] = []
    previous: tuple[int, bytes] | None = None
    current: tuple[int, bytes] | None = None
    start = 0
    size = 0
    for number, raw in enumerate(handle, start=1):
        if current is not None:
            previous = (current[0], current[1][:-1])  # not the last line: it has a newline
        current = (number, raw)
        start, size = size, size + len(raw)
        if marker in raw:
            segments = [*segments[-1:], (number, raw.removesuffix(b"\n"))]
    if current is None:
        return JournalTail(0, GENESIS_PREV, None, 0), None
    torn: TornPart | None = None
    if not current[1].endswith(b"\n"):
        torn = TornPart(current[0], start, len(current[1]), "with no newline")
    elif _object_or_none(current[1][:-1]) is None:
        torn = TornPart(current[0], start, len(current[1]), "that are not a record")
    if torn is None:
        last: tuple[int, bytes] | None = (current[0], current[1][:-1])
        end = size
    else:
        last, end = previous, start
    if last is None:
        return JournalTail(0, GENESIS_PREV, None, 0), torn
    number, line = last
    record = _parse(path, number, line)
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
    in_force = [segment for segment in segments if segment[0] <= number]
    segment = _segment_fingerprint(path, *in_force[-1]) if in_force else None
    return JournalTail(seq, line_hash(line), segment, end), torn


def _object_or_none(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    record = _object_or_none(line)
    if record is None:
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


def open_locked(path: Path, flags: int) -> int:
    """Open the journal file for writing as its one writer: never through a symbolic link,
    only a regular file that group and others cannot use, under an exclusive ``flock``.

    ``flags`` are added to ``O_RDWR | O_NOFOLLOW | O_CLOEXEC`` (``O_CREAT`` creates the
    file with mode 0600). The lock lasts until the descriptor is closed.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CoordinatorError(
                Code.AUDIT_JOURNAL_INSECURE,
                f"{path}: is a symbolic link; deployment.auditFile must name the file itself",
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CoordinatorError(Code.AUDIT_JOURNAL_BROKEN, f"{path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise CoordinatorError(
                Code.AUDIT_JOURNAL_INSECURE,
                f"{path}: mode {mode:04o} gives group or others access; it must be 0600",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CoordinatorError(
                Code.AUDIT_JOURNAL_LOCKED,
                f"{path}: another process holds the journal (a second auditd, or "
                "coordinatorctl audit seal-tail); it has one writer at a time",
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


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
