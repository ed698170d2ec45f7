"""Content-addressed workflow packages (CONTRACT §4): build and verify.

A package folder holds exactly ``workflow.yaml`` (the checked source, byte for byte) and
``manifest.json`` (RFC 8785 canonical JSON listing that file's size and SHA-256). The digest
is ``sha256:`` + the hex SHA-256 of the manifest bytes, so pinning the digest pins every byte.

``verify_package`` is the one verification every caller uses — ``check``, ``plan``, ``apply``
and component startup — so a package is judged the same way everywhere. It also parses and
checks the packaged workflow, so a package that verifies is a workflow that runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import __version__
from core.canonical import canonical_json
from core.codes import Code
from core.errors import PackageInvalid
from core.workflow import catalogue
from core.workflow.check import check_source, read_source
from core.workflow.model import FORMAT_MIN_COORDINATOR, MAX_SOURCE_BYTES, Workflow

PACKAGE_FORMAT = "registry-coordinator/package/v1"
MANIFEST = "manifest.json"
SOURCE = "workflow.yaml"
MAX_MANIFEST_BYTES = 64 * 1024
FILE_MODE = 0o644
FOLDER_MODE = 0o755
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class VerifiedPackage:
    """A package whose bytes matched its manifest (and its pinned digest, when given)."""

    root: Path
    digest: str
    workflow_id: str
    version: str
    connections: dict[str, str]
    manifest_bytes: bytes
    source_bytes: bytes
    workflow: Workflow


@dataclass(frozen=True)
class BuiltPackage:
    """What ``build_package`` wrote."""

    digest: str
    path: Path
    """The package folder ``OUT/<id>-<version>``."""
    runtime_template: Path
    """The author's runtime template ``OUT/<id>-<version>.runtime.yaml``."""
    workflow: Workflow


def digest_of(manifest_bytes: bytes) -> str:
    """The package digest: ``sha256:`` + hex SHA-256 of the canonical manifest bytes."""
    return "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()


def build_manifest(
    workflow_id: str, version: str, connections: dict[str, str], source: bytes
) -> bytes:
    """The canonical manifest for one workflow source."""
    return canonical_json(
        {
            "format": PACKAGE_FORMAT,
            "workflow": {"id": workflow_id, "version": version},
            "connections": dict(connections),
            "files": [
                {"path": SOURCE, "sha256": hashlib.sha256(source).hexdigest(), "size": len(source)}
            ],
            "coordinator": {"minVersion": FORMAT_MIN_COORDINATOR},
        }
    )


# ------------------------------------------------------------------------------------ building


def build_package(source_dir: Path, out_dir: Path) -> BuiltPackage:
    """Check ``source_dir/workflow.yaml`` and write its package and runtime template to ``out_dir``.

    The output depends only on the source bytes: not on the time, the umask, the folders
    involved or the coordinator release that built it. An earlier build of the same id and
    version is replaced.
    """
    source = read_source(source_dir)
    workflow = check_source(source)
    manifest = build_manifest(workflow.id, workflow.version, dict(workflow.connections), source)
    digest = digest_of(manifest)
    name = f"{workflow.id}-{workflow.version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir))
    try:
        os.chmod(staging, FOLDER_MODE)
        _write(staging / SOURCE, source)
        _write(staging / MANIFEST, manifest)
        _clear_previous(target)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    template = out_dir / f"{name}.runtime.yaml"
    _replace(template, runtime_template(workflow, digest).encode("utf-8"))
    verify_package(target, digest)  # the folder just written must pass the one verification
    return BuiltPackage(digest=digest, path=target, runtime_template=template, workflow=workflow)


def _write(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), FILE_MODE)  # the umask must not decide the mode
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _replace(path: Path, data: bytes) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    _write(staging, data)
    os.replace(staging, path)


def _clear_previous(target: Path) -> None:
    """Remove an earlier build at ``target``, but never a folder that is not a package."""
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir():
        raise PackageInvalid(str(target), "exists and is not a package folder; move it away")
    children = list(target.iterdir())
    for child in children:
        if child.name not in (SOURCE, MANIFEST) or child.is_symlink() or not child.is_file():
            raise PackageInvalid(
                str(target), "exists and holds files that are not part of a package; move it away"
            )
    for child in children:
        child.unlink()
    target.rmdir()


def runtime_template(workflow: Workflow, digest: str) -> str:
    """The author's runtime template: the connections the workflow needs, no secret values."""
    uses: dict[str, list[str]] = {name: [] for name in workflow.connections}
    for step in workflow.steps.values():
        what = getattr(step, "operation", None) or getattr(step, "result", None)
        connection = getattr(step, "connection", None)
        if connection in uses and what and what not in uses[connection]:
            uses[connection].append(what)
    lines = [
        f"# Runtime template for workflow {workflow.id} {workflow.version}, written by",
        "# `coordinatorctl package`. It holds no secret values. Merge it into the",
        "# deployment's runtime file, replace every TODO, then check the result with",
        "# `coordinatorctl --runtime-config FILE check`.",
        "deployment:",
        "  packages:",
        f"    - root: TODO  # absolute path of the {workflow.id}-{workflow.version} package folder",
        f"      expectedDigest: {digest}",
        "connections:" if workflow.connections else "connections: {}",
    ]
    for name, type_name in sorted(workflow.connections.items()):
        kind = catalogue.CONNECTION_TYPES[type_name]
        lines.append(f"  {name}:  # used for: {', '.join(uses[name])}")
        lines.append(f"    type: {type_name}")
        lines.append(f"    baseUrl: TODO  # https:// address of the {kind.product} API")
        lines.append(f"    profile: TODO  # {kind.profile_about}")
        if "producer" in kind.settings:
            lines.append(
                "    producer: TODO  # this coordinator's key under the project's trustedProducers"
            )
        lines += [
            "    authorization:",
            "      clientId: TODO  # this connection's client at the issuer",
            "      signingKeyRef: TODO  # secret:file/<name> of its private JWK, never the key",
            "      scopes: [TODO]",
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- verifying


def _read_regular(path: Path, limit: int) -> bytes:
    """Read a regular file without following a symlink; refuse naming the file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise PackageInvalid(str(path), "is listed in the manifest but missing") from None
    except OSError:
        raise PackageInvalid(str(path), "cannot be read as a regular file") from None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise PackageInvalid(str(path), "is not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise PackageInvalid(str(path), f"is larger than {limit:,} bytes")
    return data


def _inspect_folder(root: Path) -> None:
    if root.is_symlink():
        raise PackageInvalid(str(root), "is a symlink; a package folder must be a real folder")
    if not root.is_dir():
        raise PackageInvalid(str(root), "is not a package folder")
    for child in sorted(root.iterdir()):
        if child.is_symlink():
            raise PackageInvalid(str(child), "is a symlink; a package holds no symlinks")
        if child.name not in (SOURCE, MANIFEST):
            what = "folder" if child.is_dir() else "file"
            raise PackageInvalid(str(child), f"this {what} is not part of the package")
        if not child.is_file():
            raise PackageInvalid(str(child), "is not a regular file")


def _manifest(path: Path, data: bytes) -> dict[str, Any]:
    def refuse(reason: str) -> PackageInvalid:
        return PackageInvalid(str(path), reason)

    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError):
        raise refuse("is not JSON") from None
    if not isinstance(document, dict) or canonical_json(document) != data:
        raise refuse("is not in RFC 8785 canonical form")
    if set(document) != {"format", "workflow", "connections", "files", "coordinator"}:
        raise refuse("must have exactly format, workflow, connections, files and coordinator")
    if document["format"] != PACKAGE_FORMAT:
        raise refuse(f"format must be {PACKAGE_FORMAT}")
    workflow, connections = document["workflow"], document["connections"]
    if (
        not isinstance(workflow, dict)
        or set(workflow) != {"id", "version"}
        or not all(isinstance(v, str) for v in workflow.values())
    ):
        raise refuse("workflow must be {id, version}")
    if not isinstance(connections, dict) or not all(
        isinstance(v, str) for v in connections.values()
    ):
        raise refuse("connections must map names to connection types")
    coordinator = document["coordinator"]
    if (
        not isinstance(coordinator, dict)
        or set(coordinator) != {"minVersion"}
        or not isinstance(coordinator["minVersion"], str)
    ):
        raise refuse("coordinator must be {minVersion}")
    if _release(coordinator["minVersion"]) > _release(__version__):
        raise refuse(f"needs Registry Coordinator {coordinator['minVersion']} or newer")
    files = document["files"]
    if (
        not isinstance(files, list)
        or len(files) != 1
        or not isinstance(files[0], dict)
        or set(files[0]) != {"path", "sha256", "size"}
        or files[0]["path"] != SOURCE
        or not isinstance(files[0]["sha256"], str)
        or isinstance(files[0]["size"], bool)
        or not isinstance(files[0]["size"], int)
    ):
        raise refuse("files must list workflow.yaml with its sha256 and size, and nothing else")
    return document


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version (``0.1.0.dev0`` -> (0, 1, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    numbers = tuple(int(n) for n in match.group(0).split(".")) if match else ()
    return numbers + (0,) * (3 - len(numbers))


def verify_package(root: Path, expected_digest: str | None) -> VerifiedPackage:
    """Verify a package folder, and its digest when one is pinned; refuse naming the file.

    ``package.digest-mismatch`` when bytes differ from what the digest or manifest pins;
    ``package.invalid`` for anything else (missing, extra or symlinked files, a manifest that
    is not canonical, a packaged workflow that does not check).
    """
    _inspect_folder(root)
    manifest_path, source_path = root / MANIFEST, root / SOURCE
    if not manifest_path.exists():
        raise PackageInvalid(str(manifest_path), "is missing")
    manifest_bytes = _read_regular(manifest_path, MAX_MANIFEST_BYTES)
    manifest = _manifest(manifest_path, manifest_bytes)
    digest = digest_of(manifest_bytes)
    if expected_digest is not None and digest != expected_digest:
        raise PackageInvalid(
            str(manifest_path),
            f"the package digest is {digest}, not the expected digest",
            Code.PACKAGE_DIGEST_MISMATCH,
        )
    entry = manifest["files"][0]
    source = _read_regular(source_path, MAX_SOURCE_BYTES)
    if len(source) != entry["size"] or hashlib.sha256(source).hexdigest() != entry["sha256"]:
        raise PackageInvalid(
            str(source_path), "its bytes differ from the manifest", Code.PACKAGE_DIGEST_MISMATCH
        )
    try:
        workflow = check_source(source)
    except PackageInvalid as exc:
        raise PackageInvalid(str(source_path), exc.detail) from None
    declared = manifest["workflow"]
    if (declared["id"], declared["version"]) != (workflow.id, workflow.version):
        raise PackageInvalid(
            str(manifest_path), "workflow id or version differs from workflow.yaml"
        )
    if manifest["connections"] != dict(workflow.connections):
        raise PackageInvalid(str(manifest_path), "connections differ from workflow.yaml")
    return VerifiedPackage(
        root=root,
        digest=digest,
        workflow_id=workflow.id,
        version=workflow.version,
        connections=dict(workflow.connections),
        manifest_bytes=manifest_bytes,
        source_bytes=source,
        workflow=workflow,
    )
