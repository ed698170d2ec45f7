"""The audit journal's file: its record format, reading it back, and opening it to write
(CONTRACT §12).

auditd writes the journal (:mod:`auditd.journal`); ``coordinatorctl audit verify`` checks it
(:mod:`core.audit.verify`) and ``coordinatorctl audit seal-tail`` repairs a torn last line
(:mod:`core.audit.seal`), both without auditd. What the three must agree on is written once,
here, so the command line needs none of auditd's modules.

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

Two records mark repairs and chain like any other: ``audit-journal.write-failed``
(``outcome`` ``recovered``), which auditd writes first once the disk takes records again
after a failed write or fsync, and ``audit-journal.torn-tail`` (``outcome`` ``sealed``),
which ``coordinatorctl audit seal-tail`` writes in place of a torn last line.

Safety of the file: :func:`open_locked` opens it with ``O_NOFOLLOW`` (a symbolic link is
refused, never followed), requires a regular file that group and others have no access to
(``audit.journal-insecure``; it is refused, not repaired, because a file others could write
may already hold lines nobody in this process wrote), and holds it under an exclusive
``flock`` for as long as it is open: a second writer, another auditd or
``coordinatorctl audit seal-tail``, is refused with ``audit.journal-locked`` instead of
interleaving lines with the first and breaking the chain.

A torn last line (a write cut short by a full disk or a crash: no newline, or not a record)
is never appended to: :func:`scan` finds it, and :func:`read_tail` and auditd's opening
refuse with :class:`TornTail` until the operator seals it with ``coordinatorctl audit
seal-tail`` (:mod:`core.audit.seal`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from core.codes import Code
from core.errors import CoordinatorError

GENESIS_PREV: Final = "0" * 64
REF_LENGTH: Final = 32

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

_HEX64 = re.compile(r"[0-9a-f]{64}")


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
    """The journal's last line is torn: it can be sealed (:mod:`core.audit.seal`), not continued."""

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
