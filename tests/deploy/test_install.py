"""Installing Registry Coordinator as an operator does, and the recipe of its container image.

The slow tests follow docs/install-and-package.md on this checkout: build the wheel from a
copy of the source tree, create a fresh virtual environment at an absolute path, install
``requirements.lock`` with hashes required and then the wheel, both with ``--no-deps``, and
run the two console scripts from that environment, outside the checkout and with none of
the development environment's variables. The environment must hold everything the runtime
imports and nothing of the development tooling (devstack, grpcio-tools).

The fast tests read files only: the lock against pyproject.toml's runtime dependencies (a
dependency added without running ``make lock`` fails here), and the Dockerfile and
.dockerignore, with a small parser of their syntax (tests/deploy_live builds the image for
real).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import core
from tests.helpers.runtime_files import complete_runtime, write_runtime

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
VERSION: str = core.__version__  # pyproject reads its version from here
RUNTIME_PACKAGES = tuple(
    pattern.removesuffix("*")
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
)
LOCK = ROOT / "deploy" / "requirements.lock"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

VENV_IN_IMAGE = "/opt/registry-coordinator"
DEVELOPMENT_ONLY = ("devstack", "tests", "grpcio-tools", "grpc_tools")
# python:3.11.N-<variant>, optionally with a digest; or any python:3.11 tag with a digest.
FIXED_PYTHON_311 = re.compile(
    r"python:3\.11\.\d+[-a-z0-9]*(@sha256:[0-9a-f]{64})?|python:3\.11[^@]*@sha256:[0-9a-f]{64}"
)

# Folders of the checkout that are no part of the source: what .gitignore keeps out of a
# clone, at the top of the tree.
_NOT_SOURCE_AT_TOP = {
    ".git",
    ".venv",
    ".cache",
    "var",
    "build",
    "dist",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
}


# -- requirements.lock ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """One entry of the lock: ``name==version [; marker]`` and its ``--hash`` options."""

    name: str
    version: str
    marker: str | None
    hashes: tuple[str, ...]


_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(;\s*(?P<marker>.+))?$"
)
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def read_lock(text: str) -> dict[str, list[Pin]]:
    """The lock's entries by canonical name (more than one where the resolver split a
    package by environment markers); any line that is not a pin with hashes fails."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert pending == "", "the lock ends inside a continued line"
    pins: dict[str, list[Pin]] = {}
    for entry in logical:
        requirement, *hashes = (part.strip() for part in entry.split("--hash="))
        matched = _PIN.match(requirement)
        assert matched is not None, f"not pinned with ==: {requirement!r}"
        assert hashes, f"no --hash for {requirement!r}"
        for digest in hashes:
            assert _HASH.match(digest), f"{requirement!r}: not a sha256 hash: {digest!r}"
        name = canonicalize_name(matched["name"])
        pin = Pin(name, matched["version"], matched["marker"], tuple(hashes))
        pins.setdefault(name, []).append(pin)
    for key, entries in pins.items():
        assert len(entries) == 1 or all(pin.marker for pin in entries), f"{key} pinned twice"
    return pins


@pytest.fixture(scope="module")
def lock() -> dict[str, list[Pin]]:
    return read_lock(LOCK.read_text("utf-8"))


def test_the_lock_pins_every_runtime_dependency_within_its_range(
    lock: dict[str, list[Pin]],
) -> None:
    dependencies = [Requirement(text) for text in PYPROJECT["project"]["dependencies"]]
    assert dependencies
    for dependency in dependencies:
        name = canonicalize_name(dependency.name)
        assert name in lock, f"{name} is a runtime dependency but not in requirements.lock"
        for pin in lock[name]:
            assert dependency.specifier.contains(pin.version, prereleases=True), (
                f"requirements.lock pins {name}=={pin.version}, outside {dependency.specifier}:"
                " run `make lock`"
            )
        if dependency.marker is None and len(lock[name]) == 1:
            # Needed everywhere, so not locked for some platforms only.
            assert lock[name][0].marker is None, f"{name}: {lock[name][0].marker}"


def test_the_lock_holds_no_development_tool(lock: dict[str, list[Pin]]) -> None:
    development = {
        canonicalize_name(Requirement(text).name)
        for text in PYPROJECT["project"]["optional-dependencies"]["dev"]
    }
    assert development
    assert sorted(development & set(lock)) == []
    assert canonicalize_name("grpcio-tools") not in lock


def test_the_lock_reader_refuses_unpinned_or_unhashed_entries() -> None:
    # The checks above lean on read_lock: it must not let such an entry through.
    good = "abc==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    assert read_lock(good)["abc"][0].version == "1.0"
    for bad in ("abc==1.0\n", "abc>=1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"):
        with pytest.raises(AssertionError):
            read_lock(bad)


# -- the Dockerfile -------------------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` of a Dockerfile with its instructions, ARG defaults applied."""

    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arguments for word, arguments in self.instructions if word == keyword]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            keyword, _, arguments = whole.partition(" ")
            found.append((keyword.upper(), arguments.strip()))
    assert pending == "", "the Dockerfile ends inside a continued line"
    return found


def _substitute(text: str, values: dict[str, str]) -> str:
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda m: values.get(m[1] or m[2], m[0]),
        text,
    )


def read_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile, with ``${ARG}`` replaced by the ARG's default."""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    stage_args: dict[str, str] = {}
    for keyword, arguments in _instructions(text):
        if keyword == "FROM":
            words = _substitute(arguments, global_args).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
            stage_args = {}
            continue
        if keyword == "ARG":
            key, _, default = arguments.partition("=")
            (stage_args if stages else global_args)[key] = default.strip('"')
            if not stages:
                continue
        assert stages, f"{keyword} before the first FROM"
        stages[-1].instructions.append((keyword, _substitute(arguments, stage_args)))
    return stages


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    from_stage: str | None


def _split_run(arguments: str) -> tuple[list[Mount], list[list[str]]]:
    """A shell-form RUN: its --mount flags, and its commands split at ``&&``."""
    words = shlex.split(arguments)
    mounts: list[Mount] = []
    while words and words[0].startswith("--mount="):
        options = dict(
            option.partition("=")[::2]
            for option in words.pop(0).removeprefix("--mount=").split(",")
        )
        mounts.append(Mount(options.get("source", "."), options["target"], options.get("from")))
    commands: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    return mounts, commands


def _copy_sources(arguments: str) -> tuple[str | None, list[str]]:
    """COPY/ADD: the ``--from`` stage (None for the build context) and the source paths."""
    words = shlex.split(arguments)
    flags = [word for word in words if word.startswith("--")]
    paths = [word for word in words if not word.startswith("--")]
    origin = next((flag.partition("=")[2] for flag in flags if flag.startswith("--from=")), None)
    return origin, paths[:-1]


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return read_dockerfile(DOCKERFILE.read_text("utf-8"))


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    return stages[-1]


def _context_paths(stage: Stage) -> list[str]:
    """What a stage reads from the build context (not from another stage)."""
    paths: list[str] = []
    for keyword in ("COPY", "ADD"):
        for arguments in stage.all(keyword):
            origin, sources = _copy_sources(arguments)
            if origin is None:
                paths.extend(sources)
    for arguments in stage.all("RUN"):
        mounts, _ = _split_run(arguments)
        paths.extend(m.source for m in mounts if m.from_stage is None)
    return [path.removeprefix("./").rstrip("/") or "." for path in paths]


def test_the_image_is_one_stage_on_a_fixed_python_311_that_builds_nothing(
    stages: list[Stage],
) -> None:
    """The wheel is `make wheel`'s, not built again in a stage of its own."""
    (stage,) = stages
    # A patch release (python:3.11.N-…) or a digest, never a tag that moves.
    assert FIXED_PYTHON_311.fullmatch(stage.image), stage.image
    commands = [command for arguments in stage.all("RUN") for command in _split_run(arguments)[1]]
    assert not [c for c in commands if "wheel" in c[:4] or "build" in c[:4]], commands


def test_the_image_reads_the_lock_and_dist_and_nothing_else(runtime: Stage) -> None:
    assert set(_context_paths(runtime)) == {"deploy/requirements.lock", "dist"}
    assert runtime.all("COPY") == [] and runtime.all("ADD") == []


def test_the_runtime_stage_installs_the_lock_with_hashes_then_the_wheel(runtime: Stage) -> None:
    runs = [_split_run(arguments) for arguments in runtime.all("RUN")]
    installs = [
        (mounts, command)
        for mounts, commands in runs
        for command in commands
        if command[:1] == [f"{VENV_IN_IMAGE}/bin/pip"] and command[1:2] == ["install"]
    ]
    assert [command for _, commands in runs for command in commands].count(
        ["python3", "-m", "venv", VENV_IN_IMAGE]
    ) == 1
    assert len(installs) == 2, installs
    (mounts, lock_install), (_, wheel_install) = installs
    for _, command in installs:
        # Nothing from a package index, nothing beyond what is named.
        assert {"--no-deps", "--no-cache-dir", "--no-index"} <= set(command), command
    by_target = {m.target: m for m in mounts}
    assert "--require-hashes" in lock_install
    requirement_file = lock_install[lock_install.index("-r") + 1]
    assert by_target[requirement_file].source == "deploy/requirements.lock"
    wheels = lock_install[lock_install.index("--find-links") + 1]
    dist = next(m for m in mounts if m.source == "dist")
    assert wheels == f"{dist.target}/wheels"
    wheel = wheel_install[-1]
    assert wheel == f"{dist.target}/registry_coordinator-*-py3-none-any.whl"


def test_the_runtime_stage_carries_no_development_tooling(runtime: Stage) -> None:
    for _, arguments in runtime.instructions:
        for name in DEVELOPMENT_ONLY:
            assert name not in arguments, arguments


def test_the_service_runs_as_its_own_non_root_user(runtime: Stage) -> None:
    defaults = dict(arguments.partition("=")[::2] for arguments in runtime.all("ARG"))
    uid, gid = defaults["COORDINATOR_UID"], defaults["COORDINATOR_GID"]
    assert uid.isdigit() and gid.isdigit() and int(uid) >= 1000 and int(gid) >= 1000
    assert runtime.all("USER") == [f"{uid}:{gid}"]
    # Installed as root, run as the user: no step after USER may change the image.
    keywords = [keyword for keyword, _ in runtime.instructions]
    assert not {"RUN", "COPY", "ADD"} & set(keywords[keywords.index("USER") :])
    commands = [command for arguments in runtime.all("RUN") for command in _split_run(arguments)[1]]
    groupadd = next(command for command in commands if command[:1] == ["groupadd"])
    useradd = next(command for command in commands if command[:1] == ["useradd"])
    assert groupadd[groupadd.index("--gid") + 1] == gid and groupadd[-1] == "coordinator"
    assert useradd[useradd.index("--uid") + 1] == uid and useradd[-1] == "coordinator"
    assert useradd[useradd.index("--gid") + 1] in (gid, "coordinator")
    # The numbers are published for whoever mounts volumes or secrets for the image.
    labels = dict(
        word.partition("=")[::2]
        for arguments in runtime.all("LABEL")
        for word in shlex.split(arguments)
    )
    assert labels["io.registry-coordinator.uid"] == uid
    assert labels["io.registry-coordinator.gid"] == gid


def test_the_entrypoint_is_the_environments_coordinator(runtime: Stage) -> None:
    entrypoints = runtime.all("ENTRYPOINT")
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == [f"{VENV_IN_IMAGE}/bin/coordinator"]


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore line as a regular expression over context paths."""
    out = ""
    rest = pattern.strip("/")
    while rest:
        if rest.startswith("**/"):
            out, rest = out + "(?:.*/)?", rest[3:]
        elif rest.startswith("**"):
            out, rest = out + ".*", rest[2:]
        elif rest[0] == "*":
            out, rest = out + "[^/]*", rest[1:]
        elif rest[0] == "?":
            out, rest = out + "[^/]", rest[1:]
        else:
            out, rest = out + re.escape(rest[0]), rest[1:]
    return re.compile(out)


def ignored(path: str, lines: list[str]) -> bool:
    """Docker's rule for a path of the build context: the last line that matches the path,
    or a folder above it, decides; a line starting with ``!`` takes the path back in."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for line in lines:
        negated = line.startswith("!")
        regex = _dockerignore_regex(line.removeprefix("!"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            verdict = not negated
    return verdict


def test_the_build_context_holds_only_what_the_dockerfile_reads(stages: list[Stage]) -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text("utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for stage in stages:
        for path in _context_paths(stage):
            files = [ROOT / path] if (ROOT / path).is_file() else (ROOT / path).rglob("*")
            for file in files:
                if file.is_file() and "__pycache__" not in file.parts:
                    relative = file.relative_to(ROOT).as_posix()
                    assert not ignored(relative, lines), f"{relative} is read but left out"
    for path in (
        "devstack/stack.py",
        "tests/conftest.py",
        "var/quickstart/runtime.yaml",
        "deploy/secrets/state-key-1",
        ".venv/bin/python",
        ".git/config",
        ".cache/postgres/bin/postgres",
        "core/__pycache__/errors.cpython-311.pyc",
    ):
        assert ignored(path, lines), f"{path} would reach the image builder"


# -- the installation itself ----------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    """The built wheel, the environment it went into, and a folder outside the checkout that
    is the working directory of every command run there."""

    wheel: Path
    venv: Path
    outside: Path

    def run(
        self, *command: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=self.outside,
            env=env if env is not None else bare_environment(self.outside),
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        )


def bare_environment(home: Path) -> dict[str, str]:
    """What a service account's shell has: no COORDINATOR_* secrets, no PYTHONPATH, no
    virtual environment of the developer's."""
    return {"PATH": os.defpath, "HOME": str(home), "LANG": "C.UTF-8"}


def _pip_environment() -> dict[str, str]:
    # pip keeps its index settings (configuration files, proxy variables); only what would
    # let the new environment see this checkout's packages is dropped.
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _source_copy(source: Path, destination: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name == "__pycache__" or name.endswith(".egg-info")}
        if Path(folder) == source:
            skipped |= _NOT_SOURCE_AT_TOP & set(names)
        return skipped

    shutil.copytree(source, destination, ignore=ignore, symlinks=True)


def _checked(
    result: subprocess.CompletedProcess[str], what: str
) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{what} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    base = tmp_path_factory.mktemp("install").resolve()
    source, dist, venv, outside = base / "src", base / "dist", base / "venv", base / "outside"
    outside.mkdir()
    # A copy, so the build neither reads nor leaves build/ and *.egg-info in the checkout.
    _source_copy(ROOT, source)
    pip_env = _pip_environment()
    _checked(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--wheel-dir",
                str(dist),
                str(source),
            ],
            cwd=outside,
            env=pip_env,
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        ),
        "pip wheel",
    )
    wheels = list(dist.glob("*.whl"))
    assert [wheel.name for wheel in wheels] == [f"registry_coordinator-{VERSION}-py3-none-any.whl"]
    _checked(
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ),
        "python -m venv",
    )
    installation = Installation(wheels[0], venv, outside)
    pip = str(venv / "bin" / "pip")
    _checked(
        installation.run(
            pip, "install", "--quiet", "--require-hashes", "--no-deps", "-r", str(LOCK), env=pip_env
        ),
        "pip install -r requirements.lock",
    )
    _checked(
        installation.run(pip, "install", "--quiet", "--no-deps", str(wheels[0]), env=pip_env),
        "pip install <wheel>",
    )
    yield installation
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_holds_the_runtime_packages_and_their_sql(installation: Installation) -> None:
    with zipfile.ZipFile(installation.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(f"registry_coordinator-{VERSION}.dist-info/entry_points.txt")
    tops = {name.split("/")[0] for name in names}
    assert tops == {*RUNTIME_PACKAGES, f"registry_coordinator-{VERSION}.dist-info"}
    for package in RUNTIME_PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in {".py", ".sql", ".json", ".yaml"} and "__pycache__" not in path.parts:
                relative = path.relative_to(ROOT).as_posix()
                assert relative in names, f"{relative} is missing from the wheel"
    assert "core/db/schema.sql" in names
    assert any(name.startswith("core/db/queries/") and name.endswith(".sql") for name in names)
    scripts = entry_points.decode()
    assert "coordinator = core.launcher:main" in scripts
    assert "coordinatorctl = cli.main:main" in scripts


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_both_scripts_print_the_one_source_version(installation: Installation) -> None:
    for script in ("coordinatorctl", "coordinator"):
        result = _checked(
            installation.run(str(installation.venv / "bin" / script), "--version"), script
        )
        assert result.stdout.strip() == VERSION, (script, result.stdout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_coordinatorctl_checks_a_runtime_file_with_no_secrets_present(
    installation: Installation, tmp_path: Path
) -> None:
    document = complete_runtime(tmp_path)
    runtime_file = write_runtime(tmp_path / "runtime.yaml", document)
    assert not (tmp_path / "secrets").exists()
    result = _checked(
        installation.run(
            str(installation.venv / "bin" / "coordinatorctl"),
            "--runtime-config",
            str(runtime_file),
            "--output",
            "json",
            "check",
        ),
        "coordinatorctl check",
    )
    checked = json.loads(result.stdout)
    assert checked["status"] == "valid"
    assert checked["namespace"] == document["namespace"]
    expected = sorted(package["expectedDigest"] for package in document["deployment"]["packages"])
    assert sorted(workflow["digest"] for workflow in checked["workflows"]) == expected


_IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
packages = sys.argv[1:]
files = {}
for name in packages:
    package = importlib.import_module(name)
    files[name] = package.__file__
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        files[module.name] = importlib.import_module(module.name).__file__
missing = []
for name in ("devstack", "grpc_tools"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        missing.append(name)
print(json.dumps({"files": files, "missing": missing}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_runtime_module_imports_from_the_installation_alone(
    installation: Installation,
) -> None:
    result = _checked(
        installation.run(
            str(installation.venv / "bin" / "python"), "-c", _IMPORT_EVERYTHING, *RUNTIME_PACKAGES
        ),
        "importing every runtime module",
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    site_packages = (installation.venv / "lib").resolve()
    assert len(report["files"]) > 50
    for module, file in report["files"].items():
        assert Path(file).resolve().is_relative_to(site_packages), f"{module} came from {file}"
    # Neither the local stack nor the stub generator is part of an installation.
    assert report["missing"] == ["devstack", "grpc_tools"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_check_finds_every_dependency_satisfied(installation: Installation) -> None:
    result = _checked(
        installation.run(str(installation.venv / "bin" / "pip"), "check", env=_pip_environment()),
        "pip check",
    )
    assert "No broken requirements found." in result.stdout
