"""The systemd units in ``deploy/systemd``.

Three kinds of proof: ``systemd-analyze verify`` accepts every unit (and is shown to reject
a broken one); every unit carries the settings a security review and the runbook expect,
read with a small parser of the unit file syntax; and every service's own ``ExecStart=``
line, pointed at this checkout's ``coordinator`` and an applied test deployment, serves:
the five component units together, the all-in-one unit, the recovery-only unit.

systemd itself is not running here, so the serve tests start each command line the way its
unit would, as far as an unprivileged test can: the unit's umask, no new privileges, and
(on Linux 6.3 and later) a kernel ban on memory that is both writable and executable, the
kernel's own form of ``MemoryDenyWriteExecute=``. The other sandbox settings need a service
manager and are only read and verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.config.check import check_runtime_file
from core.config.load import load_runtime_file
from core.deploy import apply
from core.launcher import RECOVERY_ONLY, START_ORDER
from core.workflow.package import build_package
from devstack.postgres import PostgresCluster
from devstack.stack import LocalStack, http_ok, wait_until
from tests.unit.test_docs import broken_links

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED_BINARY = "/opt/registry-coordinator/bin/coordinator"
INSTALLED_RUNTIME = "/etc/registry-coordinator/runtime.yaml"
COORDINATOR = Path(sys.executable).with_name("coordinator")

TARGET = "registry-coordinator.target"
COMPONENT_UNITS = {name: f"registry-coordinator-{name}.service" for name in START_ORDER}
ALL_IN_ONE = "registry-coordinator.service"
MAINTENANCE = "registry-coordinator-recovery-only.service"
# More dispatchers, one instance each (registry-coordinator-dispatcher@2.service, ...).
TEMPLATE = "registry-coordinator-dispatcher@.service"
# The Type=notify services.
SERVICES = (*COMPONENT_UNITS.values(), TEMPLATE, ALL_IN_ONE, MAINTENANCE)
JOURNAL_UNITS = (COMPONENT_UNITS["auditd"], ALL_IN_ONE, MAINTENANCE)
# `coordinatorctl apply`, once, before the components: the only unit that sees the
# migration URL.
APPLY = "registry-coordinator-apply.service"
INSTALLED_CTL = "/opt/registry-coordinator/bin/coordinatorctl"
APPLY_SECRETS = "/etc/registry-coordinator/apply-secrets"
# The retention job and its daily timer: a oneshot that logs in as its own automation client.
RETAIN = "registry-coordinator-retain.service"
RETAIN_TIMER = "registry-coordinator-retain.timer"
# Every unit that runs components needs apply done first.
AFTER_APPLY = (*COMPONENT_UNITS.values(), TEMPLATE, ALL_IN_ONE)

JOURNAL_DIR = "/var/lib/registry-coordinator"
# The secret folder the README asks for, and the one the runbook's examples use.
SECRET_FOLDERS = (
    Path("/etc/registry-coordinator/secrets"),
    Path(APPLY_SECRETS),
    Path("/run/registry-coordinator/secrets"),
)
# The directives by which systemd creates, chowns (and for /run removes) folders.
MANAGED_FOLDERS = {
    "RuntimeDirectory": "/run",
    "StateDirectory": "/var/lib",
    "CacheDirectory": "/var/cache",
    "LogsDirectory": "/var/log",
    "ConfigurationDirectory": "/etc",
}

# What every service unit must say, setting by setting (the last assignment wins).
REQUIRED = {
    "Type": "notify",
    "NotifyAccess": "main",
    "TimeoutStartSec": "infinity",
    "WatchdogSec": "30",
    "User": "coordinator",
    "Group": "coordinator",
    "UMask": "0077",
    "KillMode": "mixed",
    "KillSignal": "SIGTERM",
    "TimeoutStopSec": "15",
    "Restart": "on-failure",
    "RuntimeDirectory": "registry-coordinator/sockets",
    "RuntimeDirectoryMode": "0700",
    "RuntimeDirectoryPreserve": "yes",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service",
}

# Directives that would give a unit write access or remove folders beyond the two above.
WIDENING = ("ReadWritePaths", "CacheDirectory", "LogsDirectory", "ConfigurationDirectory")

Unit = dict[str, dict[str, list[str]]]
"""A parsed unit file: section → key → every value assigned, in file order."""


def parse_unit(text: str) -> Unit:
    """Read unit file syntax: ``[Section]`` headers, ``Key=value`` lines, comments starting
    with ``#`` or ``;``, a trailing backslash continuing a line, and keys that repeat."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if pending is None and (not line or line[0] in "#;"):
            continue
        if pending is not None:
            line = f"{pending} {line}"
            pending = None
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("["):
            assert line.endswith("]"), f"line {number}: a section header without ']'"
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"line {number}: neither a section, a comment nor Key=value"
        assert current is not None, f"line {number}: a setting before any section"
        current.setdefault(key.strip(), []).append(value.strip())
    assert pending is None, "the file ends inside a continued line"
    return sections


def read_unit(name: str) -> Unit:
    return parse_unit((UNITS / name).read_text(encoding="utf-8"))


def last(unit: Unit, section: str, key: str) -> str | None:
    """The value systemd uses for a single-valued setting: the last assignment."""
    values = unit.get(section, {}).get(key)
    return values[-1] if values else None


def listed(unit: Unit, section: str, key: str) -> set[str]:
    """Every name a list setting (After=, Wants=, Conflicts=, ...) collects."""
    return {word for value in unit.get(section, {}).get(key, []) for word in value.split()}


def exec_start(name: str) -> list[str]:
    """The unit's one ExecStart= command line, split as systemd splits it."""
    values = read_unit(name)["Service"]["ExecStart"]
    assert len(values) == 1, f"{name}: one ExecStart= expected"
    return shlex.split(values[0])


# ------------------------------------------------------------------- systemd-analyze verify


def installable_copy(folder: Path) -> Path:
    """Copy every unit into ``folder`` with only the installed binary's path replaced by
    this checkout's ``coordinator``: verify refuses an ExecStart= binary that is absent."""
    folder.mkdir()
    for source in sorted(UNITS.iterdir()):
        if source.suffix in (".service", ".target", ".timer"):
            text = source.read_text(encoding="utf-8")
            (folder / source.name).write_text(text.replace(INSTALLED_BINARY, str(COORDINATOR)))
    return folder


def verify_problems(folder: Path) -> list[str]:
    """Run ``systemd-analyze verify`` on every unit in ``folder``; answer what it objected
    to. Most mistakes (a misspelt key, a bad value) are only warnings that leave the exit
    status 0, so any line naming one of our units counts as a problem too."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make test` installs it (Debian: systemd)"
    files = sorted(str(path) for path in folder.iterdir())
    # Warnings are printed from level "warning" up; a caller's quieter setting must not
    # hide them. --man=no and --generators=no keep verify to the files themselves. It does
    # not resolve User=/Group= (users are looked up when a unit starts), so the absent
    # "coordinator" user is no obstacle here.
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "info", "SYSTEMD_LOG_COLOR": "0"}
    result = subprocess.run(
        [analyze, "verify", "--man=no", "--generators=no", *files],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).splitlines()
    problems = [line for line in output if "registry-coordinator" in line]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}: {' / '.join(output)}")
    return problems


def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path) -> None:
    folder = installable_copy(tmp_path / "units")
    names = sorted(path.name for path in folder.iterdir())
    assert names == sorted([*SERVICES, APPLY, RETAIN, RETAIN_TIMER, TARGET])
    assert verify_problems(folder) == []


BREAKAGES = {
    "a misspelt directive": ("ProtectClock=yes", "ProtectClok=yes"),
    "a value systemd does not know": ("Restart=on-failure", "Restart=sometimes"),
    "a missing ExecStart= binary": (str(COORDINATOR), str(COORDINATOR) + "-absent"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_verify_rejects_a_broken_unit(tmp_path: Path, breakage: str) -> None:
    folder = installable_copy(tmp_path / "units")
    unit = folder / COMPONENT_UNITS["gateway"]
    old, new = BREAKAGES[breakage]
    text = unit.read_text(encoding="utf-8")
    assert text.count(old) == 1
    unit.write_text(text.replace(old, new), encoding="utf-8")
    problems = verify_problems(folder)
    assert problems, f"verify let {breakage} through"
    assert any(COMPONENT_UNITS["gateway"] in problem for problem in problems)


# -------------------------------------------------------------- systemd-analyze security

SECURITY_CEILING = 2.0
"""The highest exposure ``systemd-analyze security`` may give any unit (0 is the most
confined, 10 the least; ours are 1.7 as this is written). A change that loosens the sandbox
enough to pass it is a change to argue for, and to move this number with."""
RELAXED = {
    "NoNewPrivileges=yes": "NoNewPrivileges=no",
    "ProtectSystem=strict": "ProtectSystem=no",
    "PrivateDevices=yes": "PrivateDevices=no",
}
"""Three settings whose loosening together lifts a unit past the ceiling: the broken
variant the ceiling test must refuse."""


def exposure(folder: Path, name: str) -> float:
    """``systemd-analyze security --offline=true`` of the unit ``name`` in ``folder``."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make test` installs it (Debian: systemd)"
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(folder / name)],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_COLORS": "0"},
        timeout=60,
        check=False,
    )
    # A template is rated as an instance of itself (name@i.service).
    rated = re.escape(name).replace("@", "@i?")
    found = re.search(rf"Overall exposure level for {rated}: ([0-9.]+)", result.stdout)
    assert found, f"{name}: no exposure in {result.stdout[-300:]!r} {result.stderr[-300:]!r}"
    return float(found.group(1))


def test_every_service_unit_stays_under_the_exposure_ceiling(tmp_path: Path) -> None:
    folder = installable_copy(tmp_path / "units")
    scores = {name: exposure(folder, name) for name in (*SERVICES, APPLY, RETAIN)}
    assert {name: score for name, score in scores.items() if score > SECURITY_CEILING} == {}


def test_the_exposure_ceiling_refuses_a_loosened_sandbox(tmp_path: Path) -> None:
    folder = installable_copy(tmp_path / "units")
    unit = folder / COMPONENT_UNITS["gateway"]
    text = unit.read_text(encoding="utf-8")
    for old, new in RELAXED.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    unit.write_text(text, encoding="utf-8")
    assert exposure(folder, COMPONENT_UNITS["gateway"]) > SECURITY_CEILING


# ------------------------------------------------------------------------ required settings


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_unit_has_the_required_settings(name: str) -> None:
    service = read_unit(name)["Service"]
    wrong = {
        key: service.get(key, ["<missing>"])[-1]
        for key, value in REQUIRED.items()
        if service.get(key, ["<missing>"])[-1] != value
    }
    assert wrong == {}
    for key in WIDENING:
        assert key not in service, f"{name}: {key}= widens what the unit may write"


@pytest.mark.parametrize("name", (*SERVICES, APPLY, RETAIN))
def test_only_the_journal_units_write_the_state_folder(name: str) -> None:
    unit = read_unit(name)
    hidden = listed(unit, "Service", "InaccessiblePaths")
    if name in JOURNAL_UNITS:
        assert last(unit, "Service", "StateDirectory") == "registry-coordinator"
        assert last(unit, "Service", "StateDirectoryMode") == "0700"
        assert f"-{JOURNAL_DIR}" not in hidden
    else:
        assert "StateDirectory" not in unit["Service"]
        assert f"-{JOURNAL_DIR}" in hidden


@pytest.mark.parametrize("name", (*SERVICES, APPLY, RETAIN))
def test_only_the_apply_unit_sees_the_migration_url(name: str) -> None:
    # apply-secrets holds the migration URL (and the rest of what apply reads); apply alone
    # sees it, in place of the secrets folder, so one runtime file serves every unit.
    service = read_unit(name)["Service"]
    hidden = listed(read_unit(name), "Service", "InaccessiblePaths") - {f"-{JOURNAL_DIR}"}
    if name == APPLY:
        assert hidden == set()
        assert service["BindReadOnlyPaths"] == [f"{APPLY_SECRETS}:{SECRET_FOLDERS[0]}"]
    else:
        assert hidden == {f"-{APPLY_SECRETS}"}
        assert "BindReadOnlyPaths" not in service and "BindPaths" not in service


APPLY_REQUIRED = {
    **{key: value for key, value in REQUIRED.items() if not key.startswith("RuntimeDirectory")},
    "Type": "oneshot",
    "RemainAfterExit": "yes",
    "TimeoutStartSec": "30min",
    "Restart": "no",
}
for _notify_only in ("NotifyAccess", "WatchdogSec", "KillMode", "KillSignal", "TimeoutStopSec"):
    del APPLY_REQUIRED[_notify_only]


def test_the_apply_unit_is_a_sandboxed_oneshot() -> None:
    unit = read_unit(APPLY)
    service = unit["Service"]
    wrong = {
        key: service.get(key, ["<missing>"])[-1]
        for key, value in APPLY_REQUIRED.items()
        if service.get(key, ["<missing>"])[-1] != value
    }
    assert wrong == {}
    for key in (*WIDENING, *MANAGED_FOLDERS):
        assert key not in service, f"{APPLY}: {key}= widens what the unit may write"
    assert shlex.split(service["ExecStart"][0]) == [
        INSTALLED_CTL,
        "--runtime-config",
        INSTALLED_RUNTIME,
        "apply",
    ]
    # Pulled in by the units that need it, never enabled or started on its own.
    assert "Install" not in unit


RETAIN_REQUIRED = {
    **{key: value for key, value in APPLY_REQUIRED.items() if key != "RemainAfterExit"},
    "TimeoutStartSec": "2h",
    "RuntimeDirectory": "registry-coordinator-retain",
    "RuntimeDirectoryMode": "0700",
    "EnvironmentFile": "/etc/registry-coordinator/retain.env",
}


def test_the_retain_unit_is_a_sandboxed_oneshot_that_logs_in_then_erases() -> None:
    unit = read_unit(RETAIN)
    service = unit["Service"]
    wrong = {
        key: service.get(key, ["<missing>"])[-1]
        for key, value in RETAIN_REQUIRED.items()
        if service.get(key, ["<missing>"])[-1] != value
    }
    assert wrong == {}
    assert "RemainAfterExit" not in service  # each start runs it again
    for key in WIDENING:
        assert key not in service, f"{RETAIN}: {key}= widens what the unit may write"
    environment = dict(line.split("=", 1) for line in service["Environment"])
    assert environment == {
        "COORDINATOR_RUNTIME_CONFIG": INSTALLED_RUNTIME,
        "COORDINATOR_TOKEN_FILE": "/run/registry-coordinator-retain/token",
    }
    [login] = service["ExecStartPre"]
    assert shlex.split(login) == [
        INSTALLED_CTL,
        "login",
        "--private-key-file",
        f"{SECRET_FOLDERS[0]}/retain-client.jwk",
    ]
    [retain] = service["ExecStart"]
    assert shlex.split(retain) == [
        INSTALLED_CTL,
        "retain",
        "--older-than",
        "${RETAIN_OLDER_THAN}",
        "--limit",
        "100",
        "--all",
    ]
    # Started by its timer, never enabled on its own, and never a part of the target.
    assert "Install" not in unit
    assert RETAIN not in listed(read_unit(TARGET), "Unit", "Wants")


def test_the_retain_timer_runs_it_daily_and_catches_up_after_downtime() -> None:
    timer = read_unit(RETAIN_TIMER)
    assert timer["Timer"]["OnCalendar"] == ["daily"]
    assert timer["Timer"]["Persistent"] == ["yes"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    # A timer starts the service of its own name.
    assert "Unit" not in timer["Timer"]


@pytest.mark.parametrize("name", SERVICES)
def test_components_start_only_after_apply_succeeded(name: str) -> None:
    unit = read_unit(name)
    if name in AFTER_APPLY:
        # Requires= with After=: a failed apply fails their start; a restart of apply
        # restarts them after it.
        assert APPLY in listed(unit, "Unit", "Requires")
        assert APPLY in listed(unit, "Unit", "After")
    else:
        # The maintenance instance runs on a restored database: it never applies.
        assert APPLY not in listed(unit, "Unit", "Requires") | listed(unit, "Unit", "Wants")


@pytest.mark.parametrize("name", (*SERVICES, APPLY, RETAIN))
def test_no_unit_manages_a_folder_that_holds_secrets(name: str) -> None:
    # systemd chowns the folders these directives name when a unit starts, and removes a
    # RuntimeDirectory= when it stops: none may be a secret folder or a parent of one.
    unit = read_unit(name)
    managed = {
        Path(base) / folder
        for key, base in MANAGED_FOLDERS.items()
        for folder in listed(unit, "Service", key)
    }
    assert Path("/run/registry-coordinator") not in managed
    for secrets in SECRET_FOLDERS:
        for folder in managed:
            assert folder != secrets and folder not in secrets.parents, (folder, secrets)


def test_each_service_runs_the_installed_binary_with_the_runtime_file() -> None:
    base = [INSTALLED_BINARY, "--runtime-config", INSTALLED_RUNTIME]
    expected = {unit: [*base, "--component", name] for name, unit in COMPONENT_UNITS.items()}
    expected[TEMPLATE] = [*base, "--component", "dispatcher"]
    expected[ALL_IN_ONE] = base
    expected[MAINTENANCE] = [*base, "--recovery-only"]
    assert {name: exec_start(name) for name in SERVICES} == expected


def test_the_component_units_start_in_the_launchers_order_as_part_of_the_target() -> None:
    target = read_unit(TARGET)
    assert listed(target, "Unit", "Wants") == set(COMPONENT_UNITS.values())
    assert last(target, "Install", "WantedBy") == "multi-user.target"
    for position, name in enumerate(START_ORDER):
        unit = read_unit(COMPONENT_UNITS[name])
        assert listed(unit, "Unit", "PartOf") == {TARGET}
        earlier = {COMPONENT_UNITS[before] for before in START_ORDER[:position]}
        assert listed(unit, "Unit", "After") - {"network-online.target", APPLY} == earlier
        if name != "auditd":
            assert COMPONENT_UNITS["auditd"] in listed(unit, "Unit", "Wants")
        # Started through the target only: an [Install] here would let one be enabled alone.
        assert "Install" not in unit


def test_the_dispatcher_template_runs_beside_the_dispatcher_unit_in_the_target() -> None:
    template = read_unit(TEMPLATE)
    dispatcher = read_unit(COMPONENT_UNITS["dispatcher"])
    # The same service, only described per instance and installable into the target.
    assert template["Service"] == dispatcher["Service"]
    assert "%i" in (last(template, "Unit", "Description") or "")
    assert listed(template, "Unit", "PartOf") == {TARGET}
    assert listed(template, "Unit", "After") == listed(dispatcher, "Unit", "After")
    assert last(template, "Install", "WantedBy") == TARGET
    # What the gateway's and the target's After= say of the dispatcher unit, the template
    # says from its side: instances are ready before the gateway starts and the target is
    # reached.
    assert listed(template, "Unit", "Before") >= {COMPONENT_UNITS["gateway"], TARGET}
    # The other two ways to run cannot name instances in their Conflicts=: the template
    # names them, ordered so that the stop completes first.
    assert listed(template, "Unit", "Conflicts") == {ALL_IN_ONE, MAINTENANCE}
    assert listed(template, "Unit", "Before") >= {ALL_IN_ONE, MAINTENANCE}


def test_the_three_ways_to_run_exclude_each_other() -> None:
    components = set(COMPONENT_UNITS.values())
    all_in_one = read_unit(ALL_IN_ONE)
    maintenance = read_unit(MAINTENANCE)
    assert listed(all_in_one, "Unit", "Conflicts") == {TARGET, MAINTENANCE, *components}
    assert listed(maintenance, "Unit", "Conflicts") == {TARGET, ALL_IN_ONE, *components}
    # Ordered against what they stop, so a stop completes before the start; one direction
    # is enough and both would be a cycle.
    assert {TARGET, *components} <= listed(all_in_one, "Unit", "After")
    assert {TARGET, ALL_IN_ONE, *components} <= listed(maintenance, "Unit", "After")
    assert MAINTENANCE not in listed(all_in_one, "Unit", "After")
    assert last(all_in_one, "Install", "WantedBy") == "multi-user.target"
    assert "Install" not in maintenance, "the maintenance instance is never enabled"


def test_the_readme_links_resolve() -> None:
    assert broken_links(UNITS / "README.md") == []


# -------------------------------------------------------------------------- serving for real

PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_GET_MDWE = 66
PR_MDWE_REFUSE_EXEC_GAIN = 1


def kernel_has_mdwe() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(PR_GET_MDWE, 0, 0, 0, 0)) >= 0


# Runs in the child, then execs the unit's command: the part of the unit's sandbox a test
# can apply without a service manager. argv: umask, deny-write-execute (0/1), command...
SANDBOX = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.umask(int(sys.argv[1], 8))
if libc.prctl({PR_SET_NO_NEW_PRIVS}, 1, 0, 0, 0) != 0:
    sys.exit("sandbox: PR_SET_NO_NEW_PRIVS refused")
if sys.argv[2] == "1" and libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    sys.exit("sandbox: PR_SET_MDWE refused")
os.execv(sys.argv[3], sys.argv[3:])
"""


def sandboxed(unit: Unit, command: list[str]) -> list[str]:
    umask = last(unit, "Service", "UMask") or "0022"
    deny = last(unit, "Service", "MemoryDenyWriteExecute") == "yes" and kernel_has_mdwe()
    return [sys.executable, "-c", SANDBOX, umask, "1" if deny else "0", *command]


def test_the_sandbox_refuses_writable_executable_memory_as_the_units_ask() -> None:
    if not kernel_has_mdwe():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+): W+X not exercised here")
    probe = (
        "import mmap\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    command = sandboxed(read_unit(ALL_IN_ONE), [sys.executable, "-c", probe])
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert (result.returncode, result.stdout.strip()) == (0, "refused"), result.stderr


@dataclass
class Deployment:
    """An applied test deployment with its issuer running, and where it listens."""

    stack: LocalStack
    base_url: str
    socket_dir: Path
    producer_token: str


@pytest.fixture(scope="module")
def deployment(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("systemd")
    name = f"coordinator_systemd_{os.getpid()}"
    database = postgres_server.create_database(name)
    try:
        built = build_package(ROOT / "examples" / "appointment-booking", root / "packages")
        stack = LocalStack.prepare(
            root / "stack", packages=[(built.path, built.digest)], database=database
        )
        try:
            stack.start_products()
            asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
            config = load_runtime_file(stack.runtime_file).deployment
            assert config.internal is not None and config.internal.socket_dir is not None
            bind = config.listener.bind
            tokens = root / "tokens"
            tokens.mkdir(mode=0o700)
            token = stack.mint("producer", "alice", tokens / "alice").read_text().strip()
            yield Deployment(
                stack, f"http://{bind.host}:{bind.port}", config.internal.socket_dir, token
            )
        finally:
            stack.stop()
    finally:
        postgres_server.drop_database(name)


@dataclass
class Started:
    """The processes started from units' command lines, watched as one for wait_until."""

    processes: dict[str, subprocess.Popen[bytes]]
    logs: Path
    returncode: int | None = None

    def poll(self) -> int | None:
        for process in self.processes.values():
            code = process.poll()
            if code is not None:
                self.returncode = code
                return code
        return None

    def log_tail(self) -> str:
        parts = []
        for name in self.processes:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
            parts.append(f"--- {name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)


@contextlib.contextmanager
def started(deployment: Deployment, names: tuple[str, ...], logs: Path) -> Iterator[Started]:
    """Start each unit's ExecStart= line, with the installed binary and runtime file
    replaced by this checkout's and the test deployment's; kill what is left at the end."""
    logs.mkdir(exist_ok=True)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    runtime = str(deployment.stack.runtime_file)
    try:
        for name in names:
            argv = exec_start(name)
            assert argv[0] == INSTALLED_BINARY and argv.count(INSTALLED_RUNTIME) == 1
            command = [
                str(COORDINATOR),
                *(runtime if a == INSTALLED_RUNTIME else a for a in argv[1:]),
            ]
            with open(logs / f"{name}.log", "wb") as log:
                processes[name] = subprocess.Popen(
                    sandboxed(read_unit(name), command),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        yield Started(processes, logs)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_ready(deployment: Deployment, running: Started) -> None:
    """Poll the gateway's /ready until it answers 200; fail if any process exits first."""
    try:
        wait_until(lambda: http_ok(deployment.base_url + "/ready"), "/ready", process=running)
    except RuntimeError as error:
        raise AssertionError(f"{error}\n{running.log_tail()}") from None
    answer = httpx.get(deployment.base_url + "/ready", timeout=5.0)
    assert (answer.status_code, answer.json()) == (200, {"ready": True})


def stop_as_systemd(running: Started, name: str) -> int:
    """Send the unit's KillSignal= to its main process only (KillMode=mixed) and answer its
    exit status; fail if it is still running after the unit's TimeoutStopSec=."""
    unit = read_unit(name)
    kill_signal = signal.Signals[last(unit, "Service", "KillSignal") or "SIGTERM"]
    budget = float(last(unit, "Service", "TimeoutStopSec") or "90")
    process = running.processes[name]
    process.send_signal(kill_signal)
    try:
        return process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{name} still running {budget:.0f} s after {kill_signal.name}"
        ) from None


def reachable(socket_path: Path) -> bool:
    """True when something accepts connections on the Unix socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
        return True


@pytest.mark.postgres
@pytest.mark.slow
def test_the_five_component_units_serve_together_and_stop_on_sigterm(
    deployment: Deployment, tmp_path: Path
) -> None:
    units = tuple(COMPONENT_UNITS[name] for name in START_ORDER)
    with started(deployment, units, tmp_path / "logs") as running:
        wait_ready(deployment, running)
        for name in START_ORDER:
            if name != "gateway":  # the gateway listens on TCP only
                assert reachable(deployment.socket_dir / f"{name}.sock"), name
        # systemd stops the target's units in the reverse of their start order.
        codes = {unit: stop_as_systemd(running, unit) for unit in reversed(units)}
    assert codes == dict.fromkeys(units, 0)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_all_in_one_unit_serves_and_stops_on_sigterm(
    deployment: Deployment, tmp_path: Path
) -> None:
    with started(deployment, (ALL_IN_ONE,), tmp_path / "logs") as running:
        wait_ready(deployment, running)
        code = stop_as_systemd(running, ALL_IN_ONE)
    assert code == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_the_recovery_only_unit_serves_but_admits_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    with started(deployment, (MAINTENANCE,), tmp_path / "logs") as running:
        # /ready asks only what a recovery-only instance runs (auditd and recovery).
        wait_ready(deployment, running)
        for name in START_ORDER:
            sock = deployment.socket_dir / f"{name}.sock"
            assert reachable(sock) == (name in RECOVERY_ONLY and name != "gateway"), name
        answer = httpx.post(
            deployment.base_url + "/v1/workflows/appointment-booking/runs",
            json={"input": {"slotRef": "slot-1", "subjectRef": "s-1", "recipientRef": "r-1"}},
            headers={
                "Authorization": f"Bearer {deployment.producer_token}",
                "Idempotency-Key": "systemd-recovery-only-1",
            },
            timeout=10.0,
        )
        code = stop_as_systemd(running, MAINTENANCE)
    assert (answer.status_code, answer.json()["code"]) == (409, "admission.recovery-only")
    assert code == 0
