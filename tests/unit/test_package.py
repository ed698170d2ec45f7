"""Packages: deterministic builds, and every tampering refused naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import rfc8785

from core.errors import PackageInvalid
from core.workflow.package import (
    DIGEST,
    MANIFEST,
    SOURCE,
    BuiltPackage,
    build_package,
    digest_of,
    verify_package,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "approval-notice"


@pytest.fixture
def built(tmp_path: Path) -> BuiltPackage:
    return build_package(EXAMPLE, tmp_path / "out")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_manifest_is_canonical_and_the_digest_is_its_hash(built: BuiltPackage) -> None:
    manifest_bytes = (built.path / MANIFEST).read_bytes()
    source = (built.path / SOURCE).read_bytes()
    manifest = json.loads(manifest_bytes)
    assert rfc8785.dumps(manifest) == manifest_bytes
    assert manifest == {
        "format": "registry-coordinator/package/v1",
        "workflow": {"id": "approval-notice", "version": "1.2.0"},
        "connections": {"notices": "messaging", "review": "casework-review-producer"},
        "files": [
            {
                "path": "workflow.yaml",
                "sha256": hashlib.sha256(source).hexdigest(),
                "size": len(source),
            }
        ],
        "coordinator": {"minVersion": "0.1.0"},
    }
    assert built.digest == "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    assert built.digest == digest_of(manifest_bytes)
    assert DIGEST.fullmatch(built.digest) and not DIGEST.fullmatch(built.digest.upper())
    assert source == (EXAMPLE / "workflow.yaml").read_bytes()


def test_the_build_ignores_time_umask_and_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "a" / "deeper" / "copy"
    elsewhere.mkdir(parents=True)
    shutil.copyfile(EXAMPLE / "workflow.yaml", elsewhere / "workflow.yaml")
    (elsewhere / "notes.txt").write_text("never packaged\n")
    os.utime(elsewhere / "workflow.yaml", (1_000_000_000, 1_000_000_000))
    old = os.umask(0o077)
    try:
        first = build_package(EXAMPLE, tmp_path / "one")
    finally:
        os.umask(0o002)
    try:
        second = build_package(elsewhere, tmp_path / "two")
    finally:
        os.umask(old)
    assert first.digest == second.digest
    for name in (SOURCE, MANIFEST):
        assert (first.path / name).read_bytes() == (second.path / name).read_bytes()
        assert _mode(first.path / name) == _mode(second.path / name) == 0o644
    assert _mode(first.path) == _mode(second.path) == 0o755
    assert first.runtime_template.read_bytes() == second.runtime_template.read_bytes()
    assert _mode(first.runtime_template) == _mode(second.runtime_template) == 0o644
    assert first.path.name == second.path.name == "approval-notice-1.2.0"
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "approval-notice-1.2.0",
        "approval-notice-1.2.0.runtime.yaml",
    ]


def test_building_again_replaces_the_earlier_build(built: BuiltPackage) -> None:
    (built.path / SOURCE).write_bytes(b"stale")
    again = build_package(EXAMPLE, built.path.parent)
    assert again.digest == built.digest
    assert verify_package(again.path, built.digest).digest == built.digest


def test_a_folder_that_is_not_a_package_is_never_cleared(tmp_path: Path) -> None:
    target = tmp_path / "approval-notice-1.2.0"
    target.mkdir()
    (target / "precious.txt").write_text("keep me\n")
    with pytest.raises(PackageInvalid) as caught:
        build_package(EXAMPLE, tmp_path)
    assert caught.value.path == str(target)
    assert (target / "precious.txt").read_text() == "keep me\n"
    assert [p.name for p in tmp_path.iterdir()] == ["approval-notice-1.2.0"]  # no leftovers


def test_an_invalid_source_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "workflow.yaml").write_text("format: wrong\n")
    with pytest.raises(PackageInvalid):
        build_package(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_verify_returns_the_parsed_package(built: BuiltPackage) -> None:
    verified = verify_package(built.path, built.digest)
    assert verified.root == built.path
    assert (verified.workflow_id, verified.version) == ("approval-notice", "1.2.0")
    assert verified.connections == {"review": "casework-review-producer", "notices": "messaging"}
    assert verified.source_bytes == (EXAMPLE / "workflow.yaml").read_bytes()
    assert verified.manifest_bytes == (built.path / MANIFEST).read_bytes()
    assert verified.workflow.start == "request-review"
    assert verify_package(built.path, None).digest == built.digest


def _refused(root: Path, digest: str | None) -> PackageInvalid:
    with pytest.raises(PackageInvalid) as caught:
        verify_package(root, digest)
    return caught.value


def test_a_changed_byte_is_a_digest_mismatch_naming_the_file(built: BuiltPackage) -> None:
    path = built.path / SOURCE
    data = bytearray(path.read_bytes())
    data[-2] = ord("x") if data[-2] != ord("x") else ord("y")
    path.write_bytes(bytes(data))
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.digest-mismatch", str(path))


def test_a_changed_manifest_is_a_digest_mismatch(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    manifest = json.loads(path.read_bytes())
    manifest["coordinator"]["minVersion"] = "0.0.9"
    path.write_bytes(rfc8785.dumps(manifest))
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.digest-mismatch", str(path))
    other = "sha256:" + "0" * 64
    assert _refused(built.path, other).code == "package.digest-mismatch"


def test_an_extra_file_is_refused_naming_it(built: BuiltPackage) -> None:
    extra = built.path / "README.md"
    extra.write_text("hello\n")
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.invalid", str(extra))


def test_an_extra_folder_is_refused_naming_it(built: BuiltPackage) -> None:
    extra = built.path / "more"
    extra.mkdir()
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.invalid", str(extra))
    assert "folder" in error.reason


def test_a_symlink_is_refused_naming_it(built: BuiltPackage, tmp_path: Path) -> None:
    source = built.path / SOURCE
    outside = tmp_path / "same-bytes.yaml"
    shutil.copyfile(source, outside)
    source.unlink()
    source.symlink_to(outside)  # identical bytes, but reached through a link
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.invalid", str(source))
    assert "symlink" in error.reason


def test_a_symlinked_package_folder_is_refused(built: BuiltPackage, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(built.path, target_is_directory=True)
    error = _refused(link, built.digest)
    assert (error.code, error.path) == ("package.invalid", str(link))


def test_a_non_canonical_manifest_is_refused(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    path.write_text(json.dumps(json.loads(path.read_bytes()), indent=2))
    error = _refused(built.path, None)
    assert (error.code, error.path) == ("package.invalid", str(path))
    assert "canonical" in error.reason


def test_a_manifest_with_a_duplicate_key_is_not_canonical(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    text = path.read_text()
    path.write_text(text[:-1] + ',"format":"registry-coordinator/package/v1"}')
    error = _refused(built.path, None)
    assert (error.code, error.path) == ("package.invalid", str(path))


@pytest.mark.parametrize("name", [SOURCE, MANIFEST])
def test_a_missing_file_is_refused_naming_it(built: BuiltPackage, name: str) -> None:
    (built.path / name).unlink()
    error = _refused(built.path, built.digest)
    assert (error.code, error.path) == ("package.invalid", str(built.path / name))
    assert "missing" in error.reason


def test_a_manifest_that_disagrees_with_the_workflow_is_refused(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    manifest = json.loads(path.read_bytes())
    manifest["connections"]["notices"] = "scheduling"
    path.write_bytes(rfc8785.dumps(manifest))
    error = _refused(built.path, None)  # consistent bytes, wrong claims
    assert (error.code, error.path) == ("package.invalid", str(path))
    assert "connections" in error.reason


def test_a_packaged_workflow_that_does_not_check_is_refused(built: BuiltPackage) -> None:
    # Rewrite both files consistently: the hashes match, but the workflow is broken.
    source = (built.path / SOURCE).read_bytes().replace(b"next: approved", b"next: nowhere")
    (built.path / SOURCE).write_bytes(source)
    path = built.path / MANIFEST
    manifest = json.loads(path.read_bytes())
    manifest["files"][0].update(sha256=hashlib.sha256(source).hexdigest(), size=len(source))
    path.write_bytes(rfc8785.dumps(manifest))
    error = _refused(built.path, None)
    assert (error.code, error.path) == ("package.invalid", str(built.path / SOURCE))
    assert "steps.send-approval.next" in error.reason


def test_a_manifest_listing_other_files_is_refused(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    manifest = json.loads(path.read_bytes())
    manifest["files"].append({"path": "extra.txt", "sha256": "0" * 64, "size": 0})
    path.write_bytes(rfc8785.dumps(manifest))
    error = _refused(built.path, None)
    assert (error.code, error.path) == ("package.invalid", str(path))


def test_a_package_needing_a_newer_coordinator_is_refused(built: BuiltPackage) -> None:
    path = built.path / MANIFEST
    manifest = json.loads(path.read_bytes())
    manifest["coordinator"]["minVersion"] = "99.0.0"
    path.write_bytes(rfc8785.dumps(manifest))
    error = _refused(built.path, None)
    assert (error.code, error.path) == ("package.invalid", str(path))
    assert "99.0.0" in error.reason
