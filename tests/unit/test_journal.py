"""The audit journal: record format, hash chain, verification, group commit, failures."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import stat
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditd.journal import AuditEntry, Journal
from core.audit.format import SEGMENT_ACTION, read_tail
from core.audit.verify import main as verify_main
from core.audit.verify import verify_file
from core.clock import timestamp as format_instant
from core.codes import Code
from core.errors import CoordinatorError

KEY = bytes(range(32))
NEW_KEY = bytes(range(50, 82))
ISS = "https://issuer.example.org"
SUB = "alice.example@example.org"
CLIENT = "case-operators"
RUN = "0b7e4a34-5c1d-8e2f-9a3b-4c5d6e7f8091"
START = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        value = self.now
        self.now += timedelta(milliseconds=1)
        return value


class CountingFsync:
    """Counts fsync calls and the threads they ran on; can be told to fail or block."""

    def __init__(self) -> None:
        self.calls = 0
        self.threads: list[int] = []
        self.fail = False
        self.entered = threading.Event()
        self.release: threading.Event | None = None

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.threads.append(threading.get_ident())
        self.entered.set()
        if self.release is not None:
            self.release.wait(timeout=30)
        if self.fail:
            raise OSError(5, "Input/output error")


def ref(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


def fingerprint(key: bytes) -> str:
    return hmac.new(key, b"registry-coordinator custody v1", hashlib.sha256).hexdigest()


def operator_entry(action: str = "status", run_id: str | None = RUN) -> AuditEntry:
    return AuditEntry(
        action=action,
        outcome="accepted",
        principal=(ISS, SUB),
        client_id=CLIENT,
        run_id=run_id,
        reason="incident-2026-10-12" if action == "cancel" else None,
    )


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


@pytest.fixture
def fsync() -> CountingFsync:
    return CountingFsync()


async def open_journal(
    path: Path, fsync: CountingFsync, key: bytes = KEY, clock: FakeClock | None = None
) -> Journal:
    path.parent.mkdir(exist_ok=True)
    return await Journal.open(path, key, clock=clock or FakeClock(), fsync=fsync)


async def filled_journal(path: Path, fsync: CountingFsync, records: int = 6) -> None:
    journal = await open_journal(path, fsync)
    for number in range(records - 1):
        await journal.append([operator_entry("cancel" if number % 2 else "status")])
    await journal.close()


# -- format --------------------------------------------------------------------------------


async def test_a_new_journal_starts_with_a_segment_record(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    await journal.close()
    assert stat.S_IMODE(journal_path.stat().st_mode) == 0o600
    [line] = lines_of(journal_path)
    assert json.loads(line) == {
        "seq": 1,
        "at": "2026-01-02T03:04:05.678Z",
        "action": SEGMENT_ACTION,
        "outcome": "started",
        "principalRef": None,
        "clientRef": None,
        "reason": "fingerprint:" + fingerprint(KEY),
        "prev": "0" * 64,
    }
    assert journal.segment_start_seq == 1
    assert journal.key_fingerprint == fingerprint(KEY)


async def test_records_have_keyed_refs_fixed_order_and_a_chain(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    seqs = await journal.append([operator_entry("cancel")])
    await journal.close()
    assert seqs == [2]
    first, second = lines_of(journal_path)
    expected = (
        '{"seq":2,"at":"2026-01-02T03:04:05.679Z","action":"cancel","outcome":"accepted",'
        f'"principalRef":"{ref(KEY, ISS + chr(10) + SUB)}","clientRef":"{ref(KEY, CLIENT)}",'
        f'"runRef":"{ref(KEY, RUN)}","reason":"incident-2026-10-12",'
        f'"prev":"{hashlib.sha256(first).hexdigest()}"}}'
    )
    assert second.decode() == expected


async def test_optional_members_are_left_out_and_callerless_refs_are_null(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    await journal.append([AuditEntry(action="admission-hold", outcome="set")])
    await journal.append([operator_entry("doctor", run_id=None)])
    await journal.close()
    hold, doctor = (json.loads(line) for line in lines_of(journal_path)[1:])
    assert hold["principalRef"] is None and hold["clientRef"] is None
    assert "runRef" not in hold and "reason" not in hold
    assert "runRef" not in doctor
    assert list(doctor) == ["seq", "at", "action", "outcome", "principalRef", "clientRef", "prev"]


async def test_no_raw_identity_reaches_the_file(journal_path: Path, fsync: CountingFsync) -> None:
    journal = await open_journal(journal_path, fsync)
    await journal.append([operator_entry("cancel"), operator_entry("status")])
    await journal.close()
    text = journal_path.read_text()
    for raw in (ISS, SUB, "alice", CLIENT, RUN, RUN.replace("-", "")):
        assert raw not in text


def test_instants_are_utc_with_milliseconds() -> None:
    plus_two = timezone(timedelta(hours=2))
    moment = datetime(2026, 5, 6, 9, 0, 0, 999999, tzinfo=plus_two)
    assert format_instant(moment) == "2026-05-06T07:00:00.999Z"
    assert format_instant(datetime(2026, 5, 6, tzinfo=UTC)) == "2026-05-06T00:00:00.000Z"
    with pytest.raises(ValueError, match="aware"):
        format_instant(datetime(2026, 5, 6))  # a naive value is the point


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reason", "has space"),
        ("reason", "person@example.org"),
        ("reason", "x" * 129),
        ("reason", ""),
        ("action", "Cancel"),
        ("outcome", "ok because"),
    ],
)
def test_entries_refuse_free_text(field: str, value: str) -> None:
    fields = {"action": "cancel", "outcome": "accepted", field: value}
    with pytest.raises(ValueError, match=field):
        AuditEntry(**fields)  # type: ignore[arg-type]


# -- chain and verification ----------------------------------------------------------------


async def test_a_written_journal_verifies(journal_path: Path, fsync: CountingFsync) -> None:
    await filled_journal(journal_path, fsync)
    result = verify_file(journal_path)
    assert result.ok and result.records == 6
    assert result.last_hash == hashlib.sha256(lines_of(journal_path)[-1]).hexdigest()


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


async def test_editing_one_byte_breaks_the_chain_at_the_next_line(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    assert b'"action":"cancel"' in lines[2]
    lines[2] = lines[2].replace(b'"action":"cancel"', b'"action":"cancem"')
    rewrite(journal_path, lines)
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (4, "prev is not the hash of record 3")
    assert result.records == 3


async def test_a_byte_that_breaks_the_json_fails_at_its_own_line(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    lines[4] = lines[4][:-1] + b"]"
    rewrite(journal_path, lines)
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (5, "not a JSON record")


async def test_deleting_a_line_fails_where_it_was(journal_path: Path, fsync: CountingFsync) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    del lines[2]
    rewrite(journal_path, lines)
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (3, "seq 4 where 3 was expected")


async def test_reordering_lines_fails_at_the_first_moved_line(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    lines[2], lines[3] = lines[3], lines[2]
    rewrite(journal_path, lines)
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (3, "seq 4 where 3 was expected")


async def test_renumbered_lines_still_fail_on_the_chain(
    journal_path: Path, fsync: CountingFsync
) -> None:
    # A forger who deletes line 3 and renumbers what follows still breaks prev at line 3.
    await filled_journal(journal_path, fsync)
    records = [json.loads(line) for line in lines_of(journal_path)]
    del records[2]
    for number, record in enumerate(records, start=1):
        record["seq"] = number
    rewrite(journal_path, [json.dumps(r, separators=(",", ":")).encode() for r in records])
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (3, "prev is not the hash of record 2")


async def test_a_reformatted_line_is_not_canonical(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    lines[-1] = json.dumps(json.loads(lines[-1])).encode()  # spaces after separators
    rewrite(journal_path, lines)
    result = verify_file(journal_path)
    assert (result.line, result.reason) == (6, "not in canonical form")


async def test_an_incomplete_last_line_fails(journal_path: Path, fsync: CountingFsync) -> None:
    await filled_journal(journal_path, fsync)
    journal_path.write_bytes(journal_path.read_bytes()[:-10])
    result = verify_file(journal_path)
    assert result.line == 6 and result.reason is not None


def test_an_empty_journal_verifies(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert verify_file(path).ok


async def test_verify_command_line(
    journal_path: Path, fsync: CountingFsync, capsys: pytest.CaptureFixture[str]
) -> None:
    await filled_journal(journal_path, fsync)
    assert verify_main([str(journal_path)]) == 0
    assert "ok, 6 records" in capsys.readouterr().out
    lines = lines_of(journal_path)
    lines[1] = lines[1].replace(b'"outcome":"accepted"', b'"outcome":"accepter"')
    rewrite(journal_path, lines)
    assert verify_main([str(journal_path)]) == 1
    assert f"{journal_path}:3: prev is not the hash of record 2" in capsys.readouterr().err
    assert verify_main([str(journal_path.parent / "missing.jsonl")]) == 1


async def test_verify_runs_as_a_module(journal_path: Path, fsync: CountingFsync) -> None:
    await filled_journal(journal_path, fsync)
    command = [sys.executable, "-m", "core.audit.verify", str(journal_path)]
    good = subprocess.run(command, capture_output=True, text=True, check=False)
    assert good.returncode == 0, good.stderr
    lines = lines_of(journal_path)
    del lines[0]
    rewrite(journal_path, lines)
    bad = subprocess.run(command, capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert ":1: seq 2 where 1 was expected" in bad.stderr


# -- resuming and key changes ----------------------------------------------------------------


async def test_reopening_resumes_seq_and_chain(journal_path: Path, fsync: CountingFsync) -> None:
    await filled_journal(journal_path, fsync, records=3)
    journal = await open_journal(journal_path, fsync)
    assert journal.segment_start_seq is None  # same key: no new segment
    assert journal.last_seq == 3
    assert await journal.append([operator_entry()]) == [4]
    await journal.close()
    assert verify_file(journal_path).records == 4


async def test_a_new_audit_key_starts_a_segment_whose_refs_do_not_join(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync, records=2)
    journal = await open_journal(journal_path, fsync, key=NEW_KEY)
    await journal.append([operator_entry()])
    await journal.close()
    records = [json.loads(line) for line in lines_of(journal_path)]
    change = records[2]
    assert change["action"] == SEGMENT_ACTION and change["outcome"] == "changed"
    assert change["reason"] == "fingerprint:" + fingerprint(NEW_KEY)
    assert journal.segment_start_seq == 3
    assert records[1]["clientRef"] == ref(KEY, CLIENT)
    assert records[3]["clientRef"] == ref(NEW_KEY, CLIENT)
    assert records[1]["clientRef"] != records[3]["clientRef"]
    assert verify_file(journal_path).ok
    assert read_tail(journal_path).segment_fingerprint == fingerprint(NEW_KEY)


@pytest.mark.parametrize(
    "tail",
    [b'{"seq":2,"at":"x"', b"not json\n", b'{"seq":"two","prev":"00"}\n', b"[1,2]\n"],
    ids=["incomplete", "garbage", "bad-seq", "not-object"],
)
async def test_a_broken_tail_is_never_appended_to(
    journal_path: Path, fsync: CountingFsync, tail: bytes
) -> None:
    await filled_journal(journal_path, fsync, records=2)
    broken = journal_path.read_bytes() + tail
    journal_path.write_bytes(broken)
    with pytest.raises(CoordinatorError) as caught:
        await open_journal(journal_path, fsync)
    assert caught.value.code == Code.AUDIT_JOURNAL_BROKEN
    assert "line 3" in caught.value.detail
    assert journal_path.read_bytes() == broken


# -- group commit and failures -----------------------------------------------------------------


async def test_concurrent_appends_share_an_fsync(journal_path: Path, fsync: CountingFsync) -> None:
    journal = await open_journal(journal_path, fsync)
    before = fsync.calls
    results = await asyncio.gather(*(journal.append([operator_entry()]) for _ in range(50)))
    await journal.close()
    assert sorted(seq for seqs in results for seq in seqs) == list(range(2, 52))
    assert fsync.calls - before <= 2
    assert verify_file(journal_path).records == 51


async def test_appends_during_a_write_go_out_together(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    before = fsync.calls
    fsync.entered.clear()
    fsync.release = threading.Event()
    first = asyncio.create_task(journal.append([operator_entry()]))
    await asyncio.to_thread(fsync.entered.wait, 30)  # the first write is in its fsync now
    waiting = [asyncio.create_task(journal.append([operator_entry()])) for _ in range(20)]
    await asyncio.to_thread(fsync.release.set)
    assert await first == [2]
    later = [seq for task in waiting for seq in await task]
    await journal.close()
    assert later == list(range(3, 23))
    assert fsync.calls - before == 2


async def test_a_batch_keeps_its_records_contiguous(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    a, b = await asyncio.gather(
        journal.append([operator_entry(), operator_entry("cancel"), operator_entry()]),
        journal.append([operator_entry("doctor", run_id=None)]),
    )
    await journal.close()
    assert a == [2, 3, 4] and b == [5]


async def test_fsync_runs_off_the_event_loop_thread(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    await journal.append([operator_entry()])
    await journal.close()
    assert fsync.threads and threading.get_ident() not in fsync.threads


async def test_a_failing_fsync_makes_the_journal_unready_until_a_write_succeeds(
    journal_path: Path, fsync: CountingFsync
) -> None:
    journal = await open_journal(journal_path, fsync)
    assert journal.ready
    fsync.fail = True
    outcomes = await asyncio.gather(
        *(journal.append([operator_entry()]) for _ in range(3)), return_exceptions=True
    )
    assert all(
        isinstance(item, CoordinatorError) and item.code == Code.AUDIT_RESPONSE_UNAVAILABLE
        for item in outcomes
    )
    assert not journal.ready
    # The file is cut back to its last fsynced length before the next write, so the healed
    # journal continues the chain (tests/reliability/test_audit_journal.py has the rest).
    fsync.fail = False
    assert await journal.append([operator_entry()]) == [3]
    assert journal.ready
    await journal.close()
    assert [json.loads(line)["action"] for line in lines_of(journal_path)] == [
        SEGMENT_ACTION,
        "audit-journal.write-failed",
        "status",
    ]
    assert verify_file(journal_path).ok


async def test_a_closed_journal_refuses_appends(journal_path: Path, fsync: CountingFsync) -> None:
    journal = await open_journal(journal_path, fsync)
    await journal.close()
    assert not journal.ready
    with pytest.raises(CoordinatorError) as caught:
        await journal.append([operator_entry()])
    assert caught.value.code == Code.AUDIT_RESPONSE_UNAVAILABLE


async def test_a_failing_first_segment_write_refuses_to_open(
    journal_path: Path, fsync: CountingFsync
) -> None:
    calls = 0

    def fail_on_data(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:  # the first call is the directory's
            raise OSError(28, "No space left on device")

    journal_path.parent.mkdir()
    with pytest.raises(CoordinatorError) as caught:
        await Journal.open(journal_path, KEY, clock=FakeClock(), fsync=fail_on_data)
    assert caught.value.code == Code.AUDIT_RESPONSE_UNAVAILABLE


async def test_an_empty_append_writes_nothing(journal_path: Path, fsync: CountingFsync) -> None:
    journal = await open_journal(journal_path, fsync)
    calls = fsync.calls
    assert await journal.append([]) == []
    await journal.close()
    assert fsync.calls == calls and len(lines_of(journal_path)) == 1


async def test_wrong_audit_key_length_is_refused(journal_path: Path) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        await Journal.open(journal_path, b"short")


async def test_from_seq_skips_the_lines_before_and_takes_that_records_prev_as_given(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    # A break before the starting record is not looked at...
    lines[0] = lines[0].replace(b'"outcome":"', b'"outcome":"x', 1)
    rewrite(journal_path, lines)
    assert not verify_file(journal_path).ok
    result = verify_file(journal_path, from_seq=3)
    assert (result.ok, result.records, result.last_seq) == (True, 4, 6)
    assert result.first_prev == hashlib.sha256(lines[1]).hexdigest()
    assert result.last_hash == hashlib.sha256(lines[-1]).hexdigest()
    # ...one at or after it is, by the seq it should carry.
    lines[3] = lines[3].replace(b'"outcome":"', b'"outcome":"x', 1)
    rewrite(journal_path, lines)
    broken = verify_file(journal_path, from_seq=3)
    assert (broken.seq, broken.line, broken.reason) == (5, 5, "prev is not the hash of record 4")
    assert broken.last_seq == 4


async def test_from_seq_on_a_journal_whose_older_lines_were_archived(
    journal_path: Path, fsync: CountingFsync
) -> None:
    await filled_journal(journal_path, fsync)
    lines = lines_of(journal_path)
    rewrite(journal_path, lines[2:])  # records 3-6 only
    assert verify_file(journal_path).reason == "seq 3 where 1 was expected"
    result = verify_file(journal_path, from_seq=3)
    assert (result.ok, result.records, result.last_seq) == (True, 4, 6)
    missing = verify_file(journal_path, from_seq=9)
    assert (missing.ok, missing.seq, missing.reason) == (False, 9, "no record with seq 9")
