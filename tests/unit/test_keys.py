"""Custody fingerprints (CONTRACT §7.4) and the pure custody and planning rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.config.load import load_runtime_file
from core.deploy.custody import ConfiguredKeys, CustodyRecords, check_custody
from core.deploy.planning import compute_plan
from core.errors import CoordinatorError
from core.keys import fingerprint, fingerprints
from tests.helpers.runtime_files import complete_runtime, write_runtime

# Known answers computed independently with
#   printf 'registry-coordinator custody v1' | openssl dgst -sha256 -mac HMAC -macopt hexkey:<key>
ZERO_KEY_PRINT = "c0954219be73304c3bae85690550857a739bf9302032d469b0807ddbe4ffb53d"
COUNTING_KEY_PRINT = "da890c1702ae45e1a9522f2fad83d0b9932864584504c9ec625be8fe5ad45a37"


def test_fingerprint_matches_known_answers() -> None:
    assert fingerprint(bytes(32)) == ZERO_KEY_PRINT
    assert fingerprint(bytes(range(32))) == COUNTING_KEY_PRINT


def _write_key(root: Path, name: str, data: bytes, mode: int = 0o600) -> None:
    path = root / name
    path.write_bytes(data)
    path.chmod(mode)


@pytest.fixture
def runtime_file(tmp_path: Path) -> Path:
    document = complete_runtime(tmp_path)
    # Versions out of order in the file: the output is ordered by version all the same.
    document["deployment"]["stateKeys"].reverse()
    root = tmp_path / "secrets"
    root.mkdir(mode=0o700)
    _write_key(root, "state-key-1", bytes(32))
    _write_key(root, "state-key-2", b"\x02" * 32)
    _write_key(root, "admission-key", bytes(range(32)))
    _write_key(root, "audit-key", b"\x03" * 32)
    return write_runtime(tmp_path / "runtime.yaml", document)


def test_fingerprints_of_a_runtime_file(runtime_file: Path) -> None:
    prints = fingerprints(load_runtime_file(runtime_file))
    assert prints.to_json() == {
        "stateKeys": [
            {"version": 1, "fingerprint": ZERO_KEY_PRINT},
            {"version": 2, "fingerprint": fingerprint(b"\x02" * 32)},
        ],
        "admissionKey": COUNTING_KEY_PRINT,
        "auditKey": fingerprint(b"\x03" * 32),
    }
    text = repr(prints) + str(prints.to_json())
    assert bytes(range(32)).hex() not in text


def test_a_bad_key_file_refuses_naming_the_reference(runtime_file: Path) -> None:
    root = runtime_file.parent / "secrets"
    _write_key(root, "audit-key", b"short")
    with pytest.raises(CoordinatorError) as refused:
        fingerprints(load_runtime_file(runtime_file))
    assert refused.value.code == "secret.malformed"
    assert "secret:file/audit-key" in refused.value.detail
    _write_key(root, "audit-key", b"\x03" * 32, mode=0o644)
    with pytest.raises(CoordinatorError) as insecure:
        fingerprints(load_runtime_file(runtime_file))
    assert insecure.value.code == "secret.insecure"
    os.chmod(root / "audit-key", 0o600)
    assert fingerprints(load_runtime_file(runtime_file)).audit_key == fingerprint(b"\x03" * 32)


# ------------------------------------------------------------------ custody rules (pure)

KEYS = ConfiguredKeys(
    state={1: "a" * 64, 2: "b" * 64},
    admission="c" * 64,
    state_paths={1: "deployment.stateKeys[0]", 2: "deployment.stateKeys[1]"},
)


def _records(**changes: object) -> CustodyRecords:
    base: dict[str, object] = {
        "state": {1: "a" * 64, 2: "b" * 64},
        "admission": "c" * 64,
        "in_use": (1, 2),
    }
    base.update(changes)
    return CustodyRecords(**base)  # type: ignore[arg-type]


def test_custody_accepts_matching_keys() -> None:
    check_custody(_records(), KEYS, require_recorded=True)


@pytest.mark.parametrize(
    ("records", "words"),
    [
        (_records(in_use=(1, 2, 3)), "version 3 is used by stored payloads"),
        (
            _records(state={1: "a" * 64, 2: "d" * 64}),
            "deployment.stateKeys[1]: state key version 2",
        ),
        (_records(admission="e" * 64), "deployment.admissionKeyRef"),
    ],
)
def test_custody_refusals(records: CustodyRecords, words: str) -> None:
    for require in (True, False):
        with pytest.raises(CoordinatorError) as refused:
            check_custody(records, KEYS, require_recorded=require)
        assert refused.value.code == "command.state-key-custody"
        assert words in refused.value.detail


def test_unrecorded_keys_are_refused_only_where_recording_is_not_allowed() -> None:
    fresh = _records(state={1: "a" * 64}, admission=None, in_use=())
    check_custody(fresh, KEYS, require_recorded=False)
    with pytest.raises(CoordinatorError) as refused:
        check_custody(fresh, KEYS, require_recorded=True)
    assert "run apply" in refused.value.detail


# ------------------------------------------------------------------ plan rules (pure)

D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def test_plan_actions_are_ordered_by_id() -> None:
    entries = compute_plan({"b": D1, "a": D2, "c": D3}, {"a": D2, "c": D1, "d": D1}, ["d"])
    assert [entry.to_json() for entry in entries] == [
        {"id": "a", "action": "unchanged", "activeDigest": D2, "plannedDigest": D2},
        {"id": "b", "action": "install", "activeDigest": None, "plannedDigest": D1},
        {"id": "c", "action": "replace", "activeDigest": D1, "plannedDigest": D3},
        {"id": "d", "action": "remove", "activeDigest": D1, "plannedDigest": None},
    ]


def test_plan_refuses_an_unlisted_workflow_and_a_listed_removal() -> None:
    with pytest.raises(CoordinatorError) as unlisted:
        compute_plan({"a": D1}, {"a": D1, "x": D2}, [])
    assert unlisted.value.cli_line() == (
        "coordinator.deployment.workflow-unlisted: workflow 'x' is active but not listed"
    )
    with pytest.raises(CoordinatorError) as listed:
        compute_plan({"a": D1}, {"a": D1}, ["a"])
    assert listed.value.code == "deployment.refused"
    # Removing what is not active has nothing to do.
    assert compute_plan({"a": D1}, {"a": D1}, ["gone"])[0].action == "unchanged"
