"""Check an audit journal's hash chain, sequence and record shapes without the audit key.

``coordinatorctl audit verify --audit-file FILE [--from-seq N]`` runs it (``python -m
core.audit.verify FILE`` too, for a checkout). It passes when every line is a well-formed
record in canonical form, ``seq`` runs 1, 2, 3, … and each ``prev`` is the SHA-256 of the
line before it; otherwise it names the first record that breaks a rule, by the ``seq`` it
should have and its line.

A changed line shows up at the record that follows it (its ``prev`` no longer matches), a
removed or moved line at its own position (``seq`` jumps). The last line has no successor
to vouch for it: compare the last ``seq`` and line hash with a copy kept elsewhere to detect
a change to the final record. ``from_seq`` starts at a later record: the lines before it are
skipped unchecked and its own ``prev`` is taken as given (compare it with the line hash you
recorded for the record before), as for a journal whose older lines were archived.

The records auditd writes after a failed write (``audit-journal.write-failed``) and the one
``coordinatorctl audit seal-tail`` writes in place of a torn last line
(``audit-journal.torn-tail``) are ordinary records in the chain, so a journal that lived
through either verifies like any other; a torn last line that was never sealed fails here
as an incomplete line or as not a JSON record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.audit.format import GENESIS_PREV, OPTIONAL_KEYS, RECORD_KEYS, line_hash, serialize

_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
_REF = re.compile(r"[0-9a-f]{32}")
_WORD = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*")
_REASON = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
_REQUIRED = frozenset(RECORD_KEYS) - OPTIONAL_KEYS


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of a verification."""

    records: int
    """Records that passed before the first failure (all of them when ``ok``)."""
    line: int | None = None
    """1-based line number of the first bad record; ``None`` when the journal verifies."""
    reason: str | None = None
    """Why that record fails."""
    last_hash: str = GENESIS_PREV
    """Hash of the last good line, to compare with a copy kept elsewhere."""
    seq: int | None = None
    """The ``seq`` the first bad record should carry; ``None`` when the journal verifies."""
    last_seq: int = 0
    """``seq`` of the last good record (0 when there is none)."""
    first_prev: str | None = None
    """With ``from_seq``: the ``prev`` of the first record checked, taken as given."""

    @property
    def ok(self) -> bool:
        """True when every line verified."""
        return self.line is None


def _shape_problem(record: dict[str, Any]) -> str | None:
    keys = set(record)
    if not keys >= _REQUIRED:
        return "missing " + ", ".join(sorted(_REQUIRED - keys))
    if not keys <= set(RECORD_KEYS):
        return "unknown key " + ", ".join(sorted(keys - set(RECORD_KEYS)))
    seq = record["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int):
        return "seq is not an integer"
    if not isinstance(record["at"], str) or not _AT.fullmatch(record["at"]):
        return "at is not an RFC 3339 UTC instant with milliseconds"
    for name in ("action", "outcome"):
        if not isinstance(record[name], str) or not _WORD.fullmatch(record[name]):
            return f"{name} is not a word"
    for name in ("principalRef", "clientRef"):
        value = record[name]
        if value is not None and (not isinstance(value, str) or not _REF.fullmatch(value)):
            return f"{name} is not a 32-character reference"
    if "runRef" in record and (
        not isinstance(record["runRef"], str) or not _REF.fullmatch(record["runRef"])
    ):
        return "runRef is not a 32-character reference"
    if "reason" in record and (
        not isinstance(record["reason"], str) or not _REASON.fullmatch(record["reason"])
    ):
        return "reason is not an investigation reference"
    if not isinstance(record["prev"], str):
        return "prev is not a string"
    return None


def _parse(raw: bytes) -> dict[str, Any] | str:
    """The record of a raw line, or why it is none."""
    if not raw.endswith(b"\n"):
        return "incomplete line (no newline)"
    try:
        record = json.loads(raw[:-1])
    except ValueError:
        return "not a JSON record"
    if not isinstance(record, dict):
        return "not a JSON record"
    return record


def _line_problem(seq: int, raw: bytes, expected_prev: str | None) -> str | None:
    """Why the line that should be record ``seq`` breaks a rule; ``expected_prev`` None takes
    its ``prev`` as given."""
    record = _parse(raw)
    if isinstance(record, str):
        return record
    problem = _shape_problem(record)
    if problem is not None:
        return problem
    if record["seq"] != seq:
        return f"seq {record['seq']} where {seq} was expected"
    if expected_prev is not None and record["prev"] != expected_prev:
        what = "the genesis value" if seq == 1 else f"the hash of record {seq - 1}"
        return f"prev is not {what}"
    if serialize(record) != raw[:-1]:
        return "not in canonical form"
    return None


def _seq_of(raw: bytes) -> int | None:
    record = _parse(raw)
    if isinstance(record, str):
        return None
    seq = record.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def verify_stream(handle: Iterable[bytes], from_seq: int = 1) -> VerifyResult:
    """Verify the journal read from a binary stream (any iterable of its raw lines), from
    the record ``from_seq`` on."""
    if from_seq < 1:
        raise ValueError("from_seq starts at 1")
    expected_prev: str | None = GENESIS_PREV if from_seq == 1 else None
    first_prev: str | None = None
    seq = from_seq
    checked = 0
    line = 0
    started = from_seq == 1
    for raw in handle:
        line += 1
        if not started:
            found = _seq_of(raw)
            if found is None or found < from_seq:
                continue
            started = True
            if found == from_seq:
                first_prev = str(json.loads(raw[:-1])["prev"])
        problem = _line_problem(seq, raw, expected_prev)
        if problem is not None:
            return VerifyResult(
                checked, line, problem, expected_prev or GENESIS_PREV, seq, seq - 1, first_prev
            )
        expected_prev = line_hash(raw[:-1])
        checked += 1
        seq += 1
    if not started:
        return VerifyResult(0, line + 1, f"no record with seq {from_seq}", GENESIS_PREV, from_seq)
    return VerifyResult(
        checked, last_hash=expected_prev or GENESIS_PREV, last_seq=seq - 1, first_prev=first_prev
    )


def verify_file(path: Path, from_seq: int = 1) -> VerifyResult:
    """Verify the journal at ``path`` (from the record ``from_seq`` on)."""
    with path.open("rb") as handle:
        return verify_stream(handle, from_seq)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m core.audit.verify",
        description="Verify an audit journal's hash chain and sequence.",
    )
    parser.add_argument("file", type=Path, help="the audit journal (JSON Lines)")
    args = parser.parse_args(argv)
    path: Path = args.file
    try:
        result = verify_file(path)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc.__class__.__name__}", file=sys.stderr)
        return 1
    if not result.ok:
        print(f"{path}:{result.line}: {result.reason}", file=sys.stderr)
        return 1
    print(f"{path}: ok, {result.records} records, last line hash {result.last_hash}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
