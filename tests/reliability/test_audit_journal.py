"""The audit journal when the disk or the file misbehaves (CONTRACT §12).

- A write or fsync that fails refuses its records (503 ``audit.response-unavailable``) and
  leaves auditd not ready, and the journal heals by itself once the disk does: the next
  append (or health check) cuts back whatever the failed write left and continues the
  chain after a record saying how many records were refused meanwhile.
- A torn last line stops auditd with one line naming the seal command; ``coordinatorctl
  audit seal-tail`` moves the torn bytes aside and records the seal, and the sealed journal
  verifies.
- One writer per file (``flock``); no symbolic link; no file group or others may use.
- Whatever it lived through, a changed byte in any line but the last is found by the
  verifier, every time.

The disk is injected (``write`` and ``fsync`` of :class:`Disk`), so faults are ordered, not
waited for.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from auditd.journal import AuditEntry, Journal
from auditd.service import AuditService, open_journal
from auditd.service import serve as serve_auditd
from cli.main import main as ctl_main
from core import deploy
from core.audit.verify import verify_file
from core.codes import Code
from core.errors import CoordinatorError
from core.rpc import coordinator_pb2 as pb
from core.runtime import Store
from devstack.postgres import DatabaseHandle
from gateway.app import create_app
from gateway.backend import GrpcBackend
from gateway.routes import GatewayContext
from recovery.service import serve as serve_recovery
from tests.helpers.deployment import TestDeployment, drop_deployment, write_secret
from tests.helpers.gateway_kit import POLICIES, bearer, client_for, mint, primed, verifier
from tests.helpers.runtime_files import complete_runtime, write_runtime
from tests.helpers.serving import serving, socket_runtime
from tests.reliability.exposure import EXPOSURE

KEY = bytes(range(32))
START = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
ISS = "https://issuer.example.org"
ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """One millisecond later at every reading."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        value = self.now
        self.now += timedelta(milliseconds=1)
        return value


class Disk:
    """The journal's ``write`` and ``fsync``, with faults to order.

    ``room`` is how many more bytes writes may put down before the disk is full (``None``:
    no limit); a write that meets the limit puts down what fits, and the next one fails
    with ENOSPC, the way a full file system cuts a write short. ``fsync_fails`` makes every
    fsync fail with EIO.
    """

    def __init__(self) -> None:
        self.room: int | None = None
        self.fsync_fails = False
        self.writes = 0

    def write(self, fd: int, data: bytes) -> int:
        self.writes += 1
        if self.room is not None:
            if self.room == 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            data = data[: self.room]
            self.room -= len(data)
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    def heal(self) -> None:
        self.room = None
        self.fsync_fails = False


def entry(action: str = "status", sub: str = "alice") -> AuditEntry:
    return AuditEntry(action=action, outcome="ok", principal=(ISS, sub), client_id="ops")


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def actions(path: Path) -> list[tuple[str, str]]:
    return [(record["action"], record["outcome"]) for record in records(path)]


def refused_with(code: Code, outcome: BaseException | list[int]) -> bool:
    return isinstance(outcome, CoordinatorError) and outcome.code == code


async def opened(path: Path, disk: Disk | None = None) -> Journal:
    disk = disk or Disk()
    return await Journal.open(path, KEY, clock=Clock(), fsync=disk.fsync, write=disk.write)


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    folder = tmp_path / "audit"
    folder.mkdir()
    return folder / "audit.jsonl"


async def journal_of(path: Path, appends: int = 3) -> bytes:
    """A closed, healthy journal: a segment record and ``appends`` records."""
    journal = await opened(path)
    for number in range(appends):
        await journal.append([entry(sub=f"user-{number}")])
    await journal.close()
    return path.read_bytes()


# -- 1. a failed write or fsync, and recovery ----------------------------------------------


async def test_a_failed_fsync_refuses_then_the_next_append_heals(journal_path: Path) -> None:
    # Only the fsync seam, which the journal always had: the failure is behaviour, not API.
    disk = Disk()
    journal = await Journal.open(journal_path, KEY, clock=Clock(), fsync=disk.fsync)
    assert await journal.append([entry()]) == [2]

    disk.fsync_fails = True
    with pytest.raises(CoordinatorError) as refused:
        await journal.append([entry("cancel")])
    assert refused.value.code == Code.AUDIT_RESPONSE_UNAVAILABLE
    assert not journal.ready

    disk.heal()
    assert await journal.append([entry("inspect")]) == [4]
    assert journal.ready
    await journal.close()

    assert actions(journal_path) == [
        ("audit-key.segment", "started"),
        ("status", "ok"),
        ("audit-journal.write-failed", "recovered"),
        ("inspect", "ok"),
    ]
    assert records(journal_path)[2]["reason"] == "refused:1"
    # The refused record, written but never fsynced, was cut back: no one was told it
    # was kept, and the chain goes on from the last record that was.
    assert all(action != "cancel" for action, _ in actions(journal_path))
    assert verify_file(journal_path).ok


async def test_a_partial_line_left_by_a_full_disk_never_joins_the_chain(
    journal_path: Path,
) -> None:
    disk = Disk()
    journal = await opened(journal_path, disk)
    await journal.append([entry()])
    good = journal_path.read_bytes()

    disk.room = 25  # the next write puts down 25 bytes of a line, then the disk is full
    outcome = await _attempt(journal, entry("cancel"))
    assert refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, outcome)
    assert not journal.ready
    assert journal_path.read_bytes() == good + b'{"seq":3,"at":"2026-03-04'  # torn on disk
    outcomes = [await _attempt(journal, entry("cancel")) for _ in range(2)]
    assert all(refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, item) for item in outcomes)

    disk.heal()
    assert await journal.append([entry("inspect")]) == [4]
    await journal.close()

    assert journal_path.read_bytes().startswith(good)
    assert actions(journal_path)[2:] == [
        ("audit-journal.write-failed", "recovered"),
        ("inspect", "ok"),
    ]
    assert records(journal_path)[2]["reason"] == "refused:3"
    result = verify_file(journal_path)
    assert result.ok and result.records == 4


async def _attempt(journal: Journal, item: AuditEntry) -> BaseException | list[int]:
    try:
        return await journal.append([item])
    except CoordinatorError as exc:
        return exc


async def test_every_append_while_failing_tries_the_disk_again(journal_path: Path) -> None:
    disk = Disk()
    journal = await opened(journal_path, disk)
    disk.fsync_fails = True
    writes = disk.writes
    for _ in range(3):
        outcome = await _attempt(journal, entry())
        assert refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, outcome)
    assert disk.writes == writes + 3
    disk.heal()
    assert await journal.append([entry()]) == [3]
    await journal.close()
    assert records(journal_path)[1]["reason"] == "refused:3"


async def test_closing_while_failing_leaves_no_torn_line_for_the_next_start(
    journal_path: Path,
) -> None:
    disk = Disk()
    journal = await opened(journal_path, disk)
    await journal.append([entry()])
    good = journal_path.read_bytes()
    disk.room = 40
    assert refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, await _attempt(journal, entry()))
    await journal.close()  # SIGTERM while the disk is still full
    assert journal_path.read_bytes() == good

    again = await opened(journal_path)  # starts: nothing torn to refuse
    assert await again.append([entry()]) == [3]
    await again.close()
    assert verify_file(journal_path).ok


def _ready_gauge(text: str) -> float:
    found = re.search(r"^coordinator_audit_ready (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


async def test_auditd_is_unready_while_failing_and_ready_again_without_traffic(
    journal_path: Path,
) -> None:
    disk = Disk()
    journal = await opened(journal_path, disk)
    store = cast(Store, SimpleNamespace(available=True, activation=object()))
    service = AuditService(journal, store)
    context = cast(grpc.aio.ServicerContext, None)

    disk.fsync_fails = True
    assert refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, await _attempt(journal, entry()))
    health = await service.Check(pb.Empty(), context)
    assert list(health.reasons) == ["audit-unavailable"]  # the check's own try failed too
    assert _ready_gauge(await service.metrics_text()) == 0

    disk.heal()  # no append arrives: the next health check alone brings it back
    health = await service.Check(pb.Empty(), context)
    assert list(health.reasons) == []
    assert _ready_gauge(await service.metrics_text()) == 1
    await journal.close()
    assert actions(journal_path)[-1] == ("audit-journal.write-failed", "recovered")
    assert records(journal_path)[-1]["reason"] == "refused:1"
    assert verify_file(journal_path).ok


async def test_the_gateway_refuses_and_reports_unready_until_the_disk_returns(
    tmp_path: Path, database: DatabaseHandle
) -> None:
    deployment = TestDeployment.create(tmp_path / "deployment", database)
    (deployment.directory / "audit").mkdir()
    checked = deployment.checked()
    await deploy.apply(checked, [])
    sockets = Path(tempfile.mkdtemp(prefix="rcj-", dir="/tmp"))
    runtime = socket_runtime(checked, sockets, recovery_only=True)
    disk = Disk()
    operator = bearer(mint("pat", "platform-operators"))
    try:
        async with serving(
            auditd=lambda started: serve_auditd(
                runtime, started, write=disk.write, fsync=disk.fsync
            ),
            recovery=lambda started: serve_recovery(runtime, started),
        ):
            backend = GrpcBackend(runtime.endpoints, recovery_only=True)
            ctx = await primed(GatewayContext(backend, verifier(), POLICIES))
            try:
                async with client_for(create_app(ctx)) as api:
                    assert (await api.get("/ready")).status_code == 200

                    disk.fsync_fails = True
                    refused = await api.get("/v1/operator/doctor", headers=operator)
                    assert refused.status_code == 503
                    assert refused.json()["code"] == "audit.response-unavailable"
                    EXPOSURE.keep_response("audit-journal/refused", refused)
                    unready = await api.get("/ready")
                    assert unready.status_code == 503
                    assert "audit-unavailable" in unready.json()["reasons"]

                    disk.heal()
                    ready = await api.get("/ready")  # no restart, no action in between
                    assert ready.status_code == 200, ready.text
                    doctor = await api.get("/v1/operator/doctor", headers=operator)
                    assert doctor.status_code == 200, doctor.text
                    assert doctor.json()["state"]["auditReady"] is True
            finally:
                await backend.close()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
        await drop_deployment(database, deployment.namespace)
    journal = deployment.directory / "audit" / "audit.jsonl"
    assert ("audit-journal.write-failed", "recovered") in actions(journal)
    assert actions(journal)[-1] == ("doctor", "ok")
    assert verify_file(journal).ok
    EXPOSURE.keep_output("audit-journal/audit.jsonl", journal.read_bytes())
    EXPOSURE.keep_secret("audit-journal/operator-token", operator["Authorization"].split()[-1])


# -- 2. a torn last line, refused at start and sealed ----------------------------------------


TORN_TAILS: dict[str, Callable[[bytes], bytes]] = {
    "no-newline": lambda line: line[: len(line) // 2],
    "zero-filled": lambda line: b"\0" * 48,
    "not-a-record": lambda line: b'{"seq":5,"at":"2026-03-04T05:\x00\x00\n',
}


@pytest.fixture(params=sorted(TORN_TAILS))
def torn(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def deployment_dir(tmp_path: Path) -> Iterator[Path]:
    """A runtime file (``runtime.yaml``) whose journal is ``audit/audit.jsonl``, with the
    audit key in place: enough for auditd to reach its journal, no database."""
    document = complete_runtime(tmp_path)
    write_runtime(tmp_path / "runtime.yaml", document)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    write_secret(secrets, "audit-key", KEY)
    (tmp_path / "audit").mkdir()
    yield tmp_path


def tear(path: Path, how: str) -> bytes:
    """Append a torn line to the journal at ``path``; returns the torn bytes."""
    line = path.read_bytes().splitlines()[-1]
    torn = TORN_TAILS[how](line)
    with path.open("ab") as handle:
        handle.write(torn)
    return torn


def start_auditd(runtime_file: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "core.launcher", "--component", "auditd"]
    return subprocess.run(
        [*command, "--runtime-config", str(runtime_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def ctl(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        ctl_main(args)
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err


@pytest.mark.parametrize("place", ["a directory in its place", "no folder"])
def test_auditd_refuses_a_journal_it_cannot_open_in_one_line_naming_the_file(
    deployment_dir: Path, place: str
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    if place == "a directory in its place":
        journal.mkdir()
        why = "Is a directory"
    else:
        (deployment_dir / "audit").rmdir()
        why = "No such file or directory"

    started = start_auditd(deployment_dir / "runtime.yaml")

    assert started.returncode == 1
    lines = started.stderr.strip().splitlines()
    assert lines == [
        f"deployment.refused: deployment.auditFile {journal}: cannot be opened ({why}); it "
        "must name a regular file auditd can create or append to, in an existing folder"
    ]


async def test_auditd_refuses_a_torn_tail_in_one_line_naming_the_seal(
    deployment_dir: Path, torn: str
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    await journal_of(journal)
    tear(journal, torn)
    before = journal.read_bytes()

    started = start_auditd(deployment_dir / "runtime.yaml")

    assert started.returncode == 1
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1, started.stderr  # one line, no traceback
    assert lines[0].startswith(f"deployment.refused: audit.journal-broken: {journal}: line 5 ")
    assert "is torn" in lines[0]
    runtime_file = deployment_dir / "runtime.yaml"
    assert lines[0].endswith(f"`coordinatorctl --runtime-config {runtime_file} audit seal-tail`")
    assert journal.read_bytes() == before


async def test_the_seal_command_moves_the_torn_bytes_aside_and_continues_the_chain(
    deployment_dir: Path, torn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    good = await journal_of(journal)
    torn_bytes = tear(journal, torn)
    runtime = str(deployment_dir / "runtime.yaml")

    code, out, err = ctl(["--runtime-config", runtime, "audit", "seal-tail"], capsys)

    assert code == 0, err
    assert f"sealed: {len(torn_bytes)} torn bytes" in out
    side = journal.with_name("audit.jsonl.torn-5")
    assert side.read_bytes() == torn_bytes
    assert stat.S_IMODE(side.stat().st_mode) == 0o600
    assert journal.read_bytes().startswith(good)
    seal = records(journal)[-1]
    digest = hashlib.sha256(torn_bytes).hexdigest()
    assert seal["seq"] == 5
    assert (seal["action"], seal["outcome"]) == ("audit-journal.torn-tail", "sealed")
    assert seal["reason"] == f"bytes:{len(torn_bytes)}:sha256:{digest}"
    assert seal["principalRef"] is None and seal["clientRef"] is None
    assert torn_bytes not in journal.read_bytes()[len(good) :]
    assert verify_file(journal).ok

    # auditd starts on it again and goes on with the chain.
    again = await opened(journal)
    assert await again.append([entry()]) == [6]
    await again.close()
    result = verify_file(journal)
    assert result.ok and result.records == 6

    # Nothing left to seal: the command says so and changes nothing.
    sealed = journal.read_bytes()
    code, out, _ = ctl(
        ["--runtime-config", runtime, "audit", "seal-tail", "--output", "json"], capsys
    )
    assert code == 0
    assert json.loads(out) == {"status": "intact", "journal": str(journal)}
    assert journal.read_bytes() == sealed


async def test_a_journal_torn_in_its_first_line_is_sealed_from_the_genesis(
    deployment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    journal.write_bytes(b'{"seq":1,"at":"2026-')
    os.chmod(journal, 0o600)
    runtime = str(deployment_dir / "runtime.yaml")
    code, out, err = ctl(
        ["--runtime-config", runtime, "audit", "seal-tail", "--output", "json"], capsys
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["status"] == "sealed" and document["seq"] == 1
    assert document["tornBytes"] == 20
    assert records(journal)[0]["prev"] == "0" * 64
    again = await opened(journal)
    await again.close()
    assert actions(journal) == [
        ("audit-journal.torn-tail", "sealed"),
        ("audit-key.segment", "started"),
    ]
    assert verify_file(journal).ok


async def test_the_seal_refuses_while_auditd_holds_the_journal(
    deployment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    running = await opened(journal)
    before = journal.read_bytes()
    code, _, err = ctl(
        ["--runtime-config", str(deployment_dir / "runtime.yaml"), "audit", "seal-tail"], capsys
    )
    await running.close()
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("coordinator.audit.journal-locked: ")
    assert journal.read_bytes() == before


async def test_the_seal_refuses_a_journal_broken_before_its_last_line(
    deployment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    await journal_of(journal)
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"outcome":"ok"', b'"outcome":"no"')
    journal.write_bytes(b"".join(lines) + b'{"seq":5,')
    before = journal.read_bytes()
    code, _, err = ctl(
        ["--runtime-config", str(deployment_dir / "runtime.yaml"), "audit", "seal-tail"], capsys
    )
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"coordinator.audit.journal-broken: {journal}: line 3: prev is not")
    assert journal.read_bytes() == before
    assert list(journal.parent.iterdir()) == [journal]


async def test_the_start_refusal_names_the_seal_command(journal_path: Path) -> None:
    await journal_of(journal_path)
    torn = tear(journal_path, "no-newline")
    runtime_file = Path("/etc/registry-coordinator/runtime.yaml")
    with pytest.raises(CoordinatorError) as refused:
        await open_journal(journal_path, KEY, runtime_file)
    assert refused.value.code == Code.AUDIT_JOURNAL_BROKEN
    assert refused.value.detail == (
        f"audit.journal-broken: {journal_path}: line 5 is torn ({len(torn)} bytes with no "
        f"newline); with auditd stopped, seal it with "
        f"`coordinatorctl --runtime-config {runtime_file} audit seal-tail`"
    )


# -- 3. one writer per file --------------------------------------------------------------------


async def test_a_second_writer_is_refused_and_the_first_keeps_the_chain(
    journal_path: Path,
) -> None:
    first = await opened(journal_path)
    with pytest.raises(CoordinatorError) as refused:
        await opened(journal_path)
    assert refused.value.code == Code.AUDIT_JOURNAL_LOCKED
    assert str(journal_path) in refused.value.detail
    assert await first.append([entry()]) == [2]
    await first.close()

    second = await opened(journal_path)  # the lock went with the first writer
    assert await second.append([entry()]) == [3]
    await second.close()
    assert verify_file(journal_path).ok


async def test_a_second_auditd_refuses_to_start_in_one_line(deployment_dir: Path) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    first = await opened(journal)
    try:
        started = start_auditd(deployment_dir / "runtime.yaml")
    finally:
        await first.close()
    assert started.returncode == 1
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1, started.stderr
    assert lines[0].startswith(f"deployment.refused: audit.journal-locked: {journal}: ")
    assert verify_file(journal).ok


# -- 4. no symbolic link, no file others may use ----------------------------------------------


async def test_a_symbolic_link_is_refused_not_followed(tmp_path: Path, journal_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    await journal_of(elsewhere, appends=1)
    before = elsewhere.read_bytes()
    journal_path.symlink_to(elsewhere)
    with pytest.raises(CoordinatorError) as refused:
        await opened(journal_path)
    assert refused.value.code == Code.AUDIT_JOURNAL_INSECURE
    assert refused.value.detail == (
        f"{journal_path}: is a symbolic link; deployment.auditFile must name the file itself"
    )
    assert elsewhere.read_bytes() == before

    dangling = journal_path.with_name("dangling.jsonl")
    dangling.symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(CoordinatorError) as refused:
        await opened(dangling)
    assert refused.value.code == Code.AUDIT_JOURNAL_INSECURE
    assert not (tmp_path / "nowhere.jsonl").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o660], ids=lambda m: f"{m:04o}")
async def test_a_journal_group_or_others_may_use_is_refused_and_left_alone(
    journal_path: Path, mode: int
) -> None:
    before = await journal_of(journal_path, appends=1)
    os.chmod(journal_path, mode)
    with pytest.raises(CoordinatorError) as refused:
        await opened(journal_path)
    assert refused.value.code == Code.AUDIT_JOURNAL_INSECURE
    assert f"mode {mode:04o}" in refused.value.detail
    assert stat.S_IMODE(journal_path.stat().st_mode) == mode
    assert journal_path.read_bytes() == before


async def test_the_seal_refuses_a_symbolic_link_too(
    deployment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    real = deployment_dir / "real.jsonl"
    await journal_of(real)
    tear(real, "no-newline")
    journal.symlink_to(real)
    code, _, err = ctl(
        ["--runtime-config", str(deployment_dir / "runtime.yaml"), "audit", "seal-tail"], capsys
    )
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("coordinator.audit.journal-insecure: ")


# -- the verifier, after all of it -------------------------------------------------------------


async def test_a_changed_byte_in_any_line_but_the_last_is_found_every_time(
    deployment_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = deployment_dir / "audit" / "audit.jsonl"
    disk = Disk()
    first = await opened(journal, disk)
    await first.append([entry(), entry("cancel")])
    disk.fsync_fails = True
    assert refused_with(Code.AUDIT_RESPONSE_UNAVAILABLE, await _attempt(first, entry()))
    disk.heal()
    await first.append([entry("inspect")])
    await first.close()
    tear(journal, "no-newline")
    runtime = str(deployment_dir / "runtime.yaml")
    assert ctl(["--runtime-config", runtime, "audit", "seal-tail"], capsys)[0] == 0
    second = await opened(journal)
    await second.append([entry("doctor")])
    await second.close()
    assert [action for action, _ in actions(journal)] == [
        "audit-key.segment",
        "status",
        "cancel",
        "audit-journal.write-failed",
        "inspect",
        "audit-journal.torn-tail",
        "doctor",
    ]
    original = journal.read_bytes()
    kept = verify_file(journal)
    assert kept.ok

    lines = original.splitlines(keepends=True)
    offset = 0
    for number, line in enumerate(lines[:-1], start=1):
        for position in range(len(line)):
            changed = bytearray(original)
            changed[offset + position] ^= 0x01
            journal.write_bytes(bytes(changed))
            result = verify_file(journal)
            assert not result.ok, (number, position)
            assert result.line in (number, number + 1), (number, position, result)
        offset += len(line)
    # The last line has no successor: a change shows against the hash kept elsewhere.
    for position in range(len(lines[-1])):
        changed = bytearray(original)
        changed[offset + position] ^= 0x01
        journal.write_bytes(bytes(changed))
        result = verify_file(journal)
        assert not result.ok or result.last_hash != kept.last_hash, position
