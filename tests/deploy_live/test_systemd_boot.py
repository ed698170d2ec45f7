"""The units of deploy/systemd booted for real: systemd 252 as PID 1 of a container
(devstack/systemd_image.py), the units installed where the README installs them, the
runtime file and both secret folders the README describes, PostgreSQL 17 with TLS in a
second container.

One boot serves the module's tests, in order; each asserts one thing: every unit of the
target active only after its READY=1, and in the launcher's order after apply; the gateway's
/ready; systemd-analyze security of each loaded unit; the audit folder StateDirectory=
makes; the migration URL hidden from every unit but apply; a failed apply starting no
component; and the restore drill of the README (recovery-only, then masks, then a start of
the target that starts nothing).

The engine is the session's (tests/deploy_live/conftest.py), with what it needs.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from core.launcher import START_ORDER
from devstack.containers import Engine, HostError
from devstack.systemd_image import APPLY_SECRETS, HOST, LISTENER, SECRETS, booted
from tests.deploy_live.conftest import Images

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TARGET = "registry-coordinator.target"
APPLY = "registry-coordinator-apply.service"
ALL_IN_ONE = "registry-coordinator.service"
MAINTENANCE = "registry-coordinator-recovery-only.service"
COMPONENTS = {name: f"registry-coordinator-{name}.service" for name in START_ORDER}
TEMPLATE = "registry-coordinator-dispatcher@.service"
INSTANCES = (
    "registry-coordinator-dispatcher@1.service",
    "registry-coordinator-dispatcher@2.service",
)
SERVING = (*COMPONENTS.values(), *INSTANCES)
SECURITY_CEILING = 2.0
# What the README's restore procedure masks: everything that admits or dispatches.
RESTORE_MASKS = (
    TARGET,
    ALL_IN_ONE,
    COMPONENTS["admission"],
    COMPONENTS["dispatcher"],
    TEMPLATE,
)
ADMITS_OR_DISPATCHES = (COMPONENTS["admission"], COMPONENTS["dispatcher"], *INSTANCES, ALL_IN_ONE)
FAILING_APPLY = "/run/systemd/system/registry-coordinator-apply.service.d/rc-systemd-test.conf"


@dataclass
class Host:
    """The booted container, driven through ``docker exec``."""

    engine: Engine
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *command: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return self.engine.docker("exec", HOST, *command, check=False, timeout=timeout)

    def must(self, *command: str, timeout: float = 300.0) -> str:
        found = self.run(*command, timeout=timeout)
        assert found.returncode == 0, (
            f"{' '.join(command)} exited {found.returncode}: {found.stderr.strip()}\n"
            + self.journal()
        )
        return str(found.stdout)

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        text = self.must("systemctl", "show", "--property=" + ",".join(properties), unit)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def ready(self) -> tuple[int, str]:
        """The gateway's /ready, asked from inside the host: (status, body)."""
        probe = (
            "import urllib.request, urllib.error\n"
            "try:\n"
            f"    answer = urllib.request.urlopen('http://{LISTENER}/ready', timeout=5)\n"
            "    print(answer.status, answer.read().decode())\n"
            "except urllib.error.HTTPError as exc:\n"
            "    print(exc.code, exc.read().decode())\n"
        )
        status, _, body = self.must("/opt/registry-coordinator/bin/python", "-c", probe).partition(
            " "
        )
        return int(status), body.strip()

    def journal(self, *units: str, lines: int = 40) -> str:
        """The last journal lines of ``units`` (all registry-coordinator units by default),
        for failure messages. The service never logs a secret's value."""
        selectors = [f"--unit={unit}" for unit in units or ("registry-coordinator*",)]
        found = self.run("journalctl", "--no-pager", f"--lines={lines}", *selectors)
        return f"journal:\n{found.stdout}"


@pytest.fixture(scope="module")
def host(images: Images) -> Iterator[Host]:
    try:
        with booted(images.engine) as timings:
            made = Host(images.engine, timings)
            # The README's install: enable the target and two more dispatchers, then start.
            made.must("systemctl", "enable", TARGET, *INSTANCES)
            started = time.monotonic()
            made.must("systemctl", "start", TARGET)
            timings["systemctl start target"] = time.monotonic() - started
            print(
                "\nsystemd boot test: "
                + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
            )
            yield made
    except HostError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_every_unit_of_the_target_is_running_as_a_notify_service(host: Host) -> None:
    properties = ("LoadState", "ActiveState", "SubState", "Type", "NRestarts", "WatchdogUSec")
    states = {unit: host.show(unit, *properties) for unit in SERVING}
    for unit, state in states.items():
        print(f"{unit}: " + " ".join(f"{key}={state[key]}" for key in properties))
    expected = {
        "LoadState": "loaded",
        "ActiveState": "active",
        "SubState": "running",
        "Type": "notify",
        "NRestarts": "0",
        "WatchdogUSec": "30s",
    }
    wrong = {unit: state for unit, state in states.items() if state != expected}
    assert wrong == {}, host.journal()
    assert host.show(TARGET, "ActiveState")["ActiveState"] == "active"


def test_each_unit_started_only_once_the_units_before_it_said_ready(host: Host) -> None:
    # For Type=notify, ActiveEnterTimestamp is when systemd took READY=1; a unit ordered
    # After= another is started (ExecMainStartTimestamp) only then.
    keys = ("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    times = {unit: {k: int(v) for k, v in host.show(unit, *keys).items()} for unit in SERVING}
    apply = {k: int(v) for k, v in host.show(APPLY, "ExecMainExitTimestampMonotonic").items()}
    started = {unit: value["ExecMainStartTimestampMonotonic"] for unit, value in times.items()}
    ready = {unit: value["ActiveEnterTimestampMonotonic"] for unit, value in times.items()}
    for unit in SERVING:
        print(f"{unit}: ready {(ready[unit] - started[unit]) / 1e6:.2f} s after its start")
        assert ready[unit] > started[unit] > apply["ExecMainExitTimestampMonotonic"] > 0, unit
    order = [COMPONENTS[name] for name in START_ORDER]
    for earlier, later in itertools.pairwise(order):
        assert ready[earlier] <= started[later], (earlier, later)
    for instance in INSTANCES:
        assert ready[COMPONENTS["admission"]] <= started[instance]
        assert ready[instance] <= started[COMPONENTS["gateway"]]


def test_the_gateway_answers_ready(host: Host) -> None:
    status, body = host.ready()
    assert (status, json.loads(body)) == (200, {"ready": True}), host.journal()


def test_systemd_analyze_security_of_every_loaded_unit_stays_under_the_ceiling(
    host: Host,
) -> None:
    units = (APPLY, *SERVING, ALL_IN_ONE, MAINTENANCE)
    scores: dict[str, float] = {}
    for unit in units:
        text = host.must("systemd-analyze", "security", "--no-pager", unit)
        found = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", text)
        assert found, f"{unit}: no exposure level in {text[-300:]!r}"
        scores[unit] = float(found.group(1))
        print(f"systemd-analyze security {unit}: {scores[unit]}")
    assert {unit: score for unit, score in scores.items() if score > SECURITY_CEILING} == {}


def test_state_directory_made_the_audit_folder_for_the_service_user_only(host: Host) -> None:
    folder = "/var/lib/registry-coordinator"
    listing = host.must("stat", "--format=%U:%G %a %F", folder, f"{folder}/audit.jsonl")
    assert listing.splitlines() == [
        "coordinator:coordinator 700 directory",
        "coordinator:coordinator 600 regular file",
    ]


def test_apply_ran_first_and_only_apply_sees_the_migration_url(host: Host) -> None:
    state = host.show(APPLY, "Type", "ActiveState", "SubState", "Result", "ExecMainStatus")
    assert state == {
        "Type": "oneshot",
        "ActiveState": "active",
        "SubState": "exited",
        "Result": "success",
        "ExecMainStatus": "0",
    }
    assert "applied" in host.journal(APPLY)
    # The components' own folder has no migration URL at all; apply's folder is hidden from
    # each of them by an inaccessible mount (systemd's empty 000 folder) in its namespace.
    assert host.run("test", "-e", f"{SECRETS}/migration-db-url").returncode == 1
    assert host.run("test", "-s", f"{APPLY_SECRETS}/migration-db-url").returncode == 0
    for unit in SERVING:
        pid = host.show(unit, "MainPID")["MainPID"]
        mounts = host.must("cat", f"/proc/{pid}/mountinfo").splitlines()
        hidden = [line.split()[3] for line in mounts if line.split()[4] == APPLY_SECRETS]
        assert hidden and all(root.endswith("/inaccessible/dir") for root in hidden), unit


def test_a_failed_apply_starts_no_component(host: Host) -> None:
    host.must("systemctl", "stop", TARGET, APPLY)
    # The apply unit given the components' secret folder instead of its own: it cannot read
    # the migration URL and exits non-zero, a real refusal of `coordinatorctl apply`.
    host.must("mkdir", "-p", FAILING_APPLY.rsplit("/", 1)[0])
    drop_in = f"[Service]\nBindReadOnlyPaths=\nBindReadOnlyPaths={SECRETS}:{SECRETS}\n"
    host.must("sh", "-c", f"printf '%s' '{drop_in}' > {FAILING_APPLY}")
    try:
        host.must("systemctl", "daemon-reload")
        host.run("systemctl", "start", TARGET)
        result = host.show(APPLY, "ActiveState", "Result")
        assert result == {"ActiveState": "failed", "Result": "exit-code"}, host.journal(APPLY)
        assert "migration" in host.journal(APPLY).lower()
        states = {unit: host.show(unit, "ActiveState")["ActiveState"] for unit in SERVING}
        print("after a failed apply: " + ", ".join(f"{u} {s}" for u, s in states.items()))
        assert set(states.values()) == {"inactive"}, states
    finally:
        host.must("rm", "-rf", FAILING_APPLY.rsplit("/", 1)[0])
        host.must("systemctl", "daemon-reload")
        host.must("systemctl", "reset-failed", APPLY)
    host.must("systemctl", "start", TARGET)
    states = {unit: host.show(unit, "SubState")["SubState"] for unit in SERVING}
    assert set(states.values()) == {"running"}, states


def test_the_restore_drill_starts_nothing_that_admits_or_dispatches(host: Host) -> None:
    # The README's order: the maintenance instance first (its start stops every ordinary
    # unit, the dispatcher@ instances through the template's Conflicts=), then the masks.
    host.must("systemctl", "start", MAINTENANCE)
    host.must("systemctl", "mask", *RESTORE_MASKS)

    # A reboot-like start: the target, a dispatcher instance and the boot's own target.
    refused = host.run("systemctl", "start", TARGET)
    assert refused.returncode != 0 and "masked" in refused.stderr, refused.stderr
    refused = host.run("systemctl", "start", INSTANCES[0])
    assert refused.returncode != 0 and "masked" in refused.stderr, refused.stderr
    host.must("systemctl", "start", "multi-user.target")

    states = {
        unit: host.show(unit, "LoadState", "ActiveState")
        for unit in (*ADMITS_OR_DISPATCHES, COMPONENTS["gateway"], MAINTENANCE)
    }
    for unit, state in states.items():
        print(f"during the restore: {unit} {state['LoadState']} {state['ActiveState']}")
    for unit in ADMITS_OR_DISPATCHES:
        assert states[unit] == {"LoadState": "masked", "ActiveState": "inactive"}, unit
    assert states[COMPONENTS["gateway"]]["ActiveState"] == "inactive"
    assert states[MAINTENANCE]["ActiveState"] == "active"
    # With the gateway unit inactive, the one answering is the maintenance instance's.
    status, body = host.ready()
    assert (status, json.loads(body)) == (200, {"ready": True}), host.journal(MAINTENANCE)

    # Step 7 of the runbook: back to the ordinary units.
    host.must("systemctl", "unmask", *RESTORE_MASKS)
    host.must("systemctl", "start", TARGET)
    assert host.show(MAINTENANCE, "ActiveState")["ActiveState"] == "inactive"
    states_after = {unit: host.show(unit, "SubState")["SubState"] for unit in SERVING}
    assert set(states_after.values()) == {"running"}, states_after
    assert host.ready()[0] == 200
