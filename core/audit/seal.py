"""Seal a torn last line of the audit journal, so auditd can continue the chain.

A write cut short (a full disk, a crash, a power cut) can leave the journal's last line
without its newline, or as bytes that are not a record. auditd never appends to such a
file (:class:`core.audit.format.TornTail`), and nobody should edit the evidence by hand.
This is the one sanctioned repair, run by ``coordinatorctl audit seal-tail`` while auditd
is stopped. In this order:

1. open the journal as auditd does (no symbolic link, mode 0600, the exclusive lock, so a
   running auditd makes it refuse with ``audit.journal-locked``);
2. check that the only fault is a torn last line and that every line before it verifies
   (:mod:`core.audit.verify`); anything else refuses with ``audit.journal-broken``;
3. copy the torn bytes, unchanged, to a side file beside the journal,
   ``<journal>.torn-<seq>`` (mode 0600, created exclusively, fsynced with its folder);
4. write, in place of the torn bytes, an ``audit-journal.torn-tail`` record (``outcome``
   ``sealed``, no caller) whose ``reason`` is ``bytes:<count>:sha256:<hex digest>`` of the
   torn bytes, never their content; cut the file after it and fsync.

The record continues the chain, so ``coordinatorctl audit verify`` accepts the sealed journal,
and the side file can be matched to the record by its digest. A crash during step 4 leaves
at worst another torn tail, and running the command again seals that.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from core.audit.format import SEAL_ACTION, SEALED, open_locked, scan, serialize
from core.audit.verify import verify_stream
from core.clock import timestamp
from core.codes import Code
from core.errors import CoordinatorError

SEAL_REASON_PREFIX = "bytes:"


@dataclass(frozen=True)
class Sealed:
    """What :func:`seal_torn_tail` did."""

    journal: Path
    """The journal file."""
    side_file: Path
    """Where the torn bytes now are."""
    seq: int
    """``seq`` of the seal record."""
    torn_bytes: int
    """How many bytes were moved aside."""
    torn_sha256: str
    """Lowercase hex SHA-256 of those bytes."""

    def to_json(self) -> dict[str, Any]:
        """The document ``coordinatorctl audit seal-tail --output json`` prints."""
        return {
            "status": "sealed",
            "journal": str(self.journal),
            "sideFile": str(self.side_file),
            "seq": self.seq,
            "tornBytes": self.torn_bytes,
            "tornSha256": self.torn_sha256,
        }


def seal_reason(torn: bytes) -> str:
    """The seal record's ``reason``: the torn bytes' count and SHA-256, never their content."""
    return f"{SEAL_REASON_PREFIX}{len(torn)}:sha256:{hashlib.sha256(torn).hexdigest()}"


def side_file_for(journal: Path, seq: int) -> Path:
    """The side file the torn bytes sealed by record ``seq`` are kept in."""
    return journal.with_name(f"{journal.name}.torn-{seq}")


def _default_clock() -> datetime:
    return datetime.now(UTC)


def seal_torn_tail(
    path: Path,
    *,
    clock: Callable[[], datetime] = _default_clock,
    fsync: Callable[[int], None] = os.fsync,
) -> Sealed | None:
    """Seal the journal's torn last line; ``None`` when the last line is not torn.

    Refuses with ``audit.journal-locked`` while auditd runs, ``audit.journal-insecure`` for
    a symbolic link or a file group or others may use, and ``audit.journal-broken`` when
    the file is missing or broken anywhere but in its last line.
    """
    if not os.path.lexists(path):
        raise CoordinatorError(Code.AUDIT_JOURNAL_BROKEN, f"{path}: no such journal file")
    fd = open_locked(path, 0)
    try:
        with os.fdopen(os.dup(fd), "rb") as handle:
            tail, torn = scan(handle, path)
            if torn is None:
                return None
            _verify_before(handle, path, torn.start)
            handle.seek(torn.start)
            torn_bytes = handle.read()
        seq = tail.last_seq + 1
        record = {
            "seq": seq,
            "at": timestamp(clock()),
            "action": SEAL_ACTION,
            "outcome": SEALED,
            "principalRef": None,
            "clientRef": None,
            "reason": seal_reason(torn_bytes),
            "prev": tail.prev,
        }
        line = serialize(record) + b"\n"
        side = side_file_for(path, seq)
        _keep_aside(side, torn_bytes, fsync)
        # In place of the torn bytes, then cut: never more than one torn line at a time.
        os.pwrite(fd, line, torn.start)
        os.ftruncate(fd, torn.start + len(line))
        fsync(fd)
    finally:
        os.close(fd)
    digest = hashlib.sha256(torn_bytes).hexdigest()
    return Sealed(path, side, seq, len(torn_bytes), digest)


def _verify_before(handle: BinaryIO, path: Path, end: int) -> None:
    """Refuse unless the lines before the torn one verify: sealing repairs only a torn end."""
    handle.seek(0)
    result = verify_stream(_Bounded(handle, end))
    if not result.ok:
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN,
            f"{path}: line {result.line}: {result.reason}; only a torn last line can be "
            "sealed, so keep the file as evidence and investigate",
        )


class _Bounded:
    """The lines of ``handle`` up to byte ``end`` (a line boundary)."""

    def __init__(self, handle: BinaryIO, end: int) -> None:
        self._handle = handle
        self._left = end

    def __iter__(self) -> _Bounded:
        return self

    def __next__(self) -> bytes:
        if self._left <= 0:
            raise StopIteration
        line = self._handle.readline(self._left)
        if not line:
            raise StopIteration
        self._left -= len(line)
        return line


def _keep_aside(side: Path, data: bytes, fsync: Callable[[int], None]) -> None:
    """Write ``data`` to a new owner-only file and make it and its name durable."""
    try:
        fd = os.open(
            side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        if _same_content(side, data):
            return  # an earlier run stopped after keeping these very bytes
        raise CoordinatorError(
            Code.AUDIT_JOURNAL_BROKEN,
            f"{side}: already exists with other content; move it away, then seal again",
        ) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fsync(fd)
    finally:
        os.close(fd)
    folder = os.open(side.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(folder)
    finally:
        os.close(folder)


def _same_content(side: Path, data: bytes) -> bool:
    try:
        fd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        return handle.read(len(data) + 1) == data
