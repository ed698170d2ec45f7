"""The offline check of a runtime file and its packages (``coordinatorctl check``).

On top of everything :mod:`core.config.load` refuses, this verifies each pinned package
against its digest and applies the rules that join the file with the packages: one package
per workflow id, the connections each workflow needs, and the workflows that policies and
event sources name. It never opens a secret file, never resolves a host name and never
contacts an endpoint.

Every problem is reported in one run: the file's own, then each package that does not verify,
then the joining rules for what did load. A joining rule that would need a refused part is
skipped: with a package that does not verify, no policy or event source is told that its
workflow is not pinned (it may be that package's).
"""

from __future__ import annotations

from pathlib import Path

from core.config.context import Loaded
from core.config.load import read_runtime_file
from core.config.model import CheckedDeployment, RuntimeConfig
from core.errors import ConfigInvalid, CoordinatorError
from core.paths import index, key
from core.workflow.package import VerifiedPackage, verify_package
from core.yamlsafe import FAILED, Maybe, Problems, need

_PACKAGES = "deployment.packages"


def check_runtime_file(path: Path) -> CheckedDeployment:
    """Load a runtime file, verify its packages and apply every rule.

    Refuses with the first problem, which carries every problem found (``extra["problems"]``).
    """
    reading = read_runtime_file(path)
    packages = _check_packages(reading.loaded, reading.problems)
    reading.problems.raise_first()
    return CheckedDeployment(config=need(reading.config), packages=need(packages))


def check_config(config: RuntimeConfig) -> CheckedDeployment:
    """Verify the packages of a loaded runtime file and the rules that involve them."""
    problems = Problems()
    packages = _check_packages(Loaded.of(config), problems)
    problems.raise_first()
    return CheckedDeployment(config=config, packages=need(packages))


def _check_packages(loaded: Loaded, problems: Problems) -> Maybe[dict[str, VerifiedPackage]]:
    if loaded.pins is None:
        return FAILED  # the packages list itself was refused
    packages, every_one = _verify_packages(loaded, problems)
    _check_connections(loaded, packages, problems)
    if every_one:
        _check_policies(loaded, packages, problems)
        _check_event_sources(loaded, packages, problems)
    return FAILED if problems else packages


def _verify_packages(loaded: Loaded, problems: Problems) -> tuple[dict[str, VerifiedPackage], bool]:
    """The packages that verify, and whether every pin did (so every pinned id is known)."""
    packages: dict[str, VerifiedPackage] = {}
    positions: dict[str, int] = {}
    every_one = True
    for position, pin in enumerate(loaded.pins or ()):
        try:
            verified = verify_package(pin.root, pin.expected_digest)
        except CoordinatorError as exc:
            problems.add(exc, at=index(_PACKAGES, position))
            every_one = False
            continue
        workflow_id = verified.workflow_id
        if workflow_id in packages:
            problems.add(
                ConfigInvalid(
                    index(_PACKAGES, position),
                    f"workflow '{workflow_id}' is already pinned by "
                    f"{_PACKAGES}[{positions[workflow_id]}]; one package per workflow",
                )
            )
            continue
        packages[workflow_id] = verified
        positions[workflow_id] = position
    return packages, every_one


def _check_connections(
    loaded: Loaded, packages: dict[str, VerifiedPackage], problems: Problems
) -> None:
    if loaded.connections is None:
        return  # the connections block itself was refused
    for workflow_id, package in packages.items():
        for name, needed_type in sorted(package.connections.items()):
            if name in loaded.unreadable_connections:
                continue
            connection = loaded.connections.get(name)
            path = key("connections", name)
            if connection is None:
                problems.add(
                    ConfigInvalid(
                        path,
                        f"workflow '{workflow_id}' needs a {needed_type} connection named {name}",
                    )
                )
            elif connection.type != needed_type:
                problems.add(
                    ConfigInvalid(
                        key(path, "type"),
                        f"workflow '{workflow_id}' needs this connection to be {needed_type}",
                    )
                )


def _check_policies(
    loaded: Loaded, packages: dict[str, VerifiedPackage], problems: Problems
) -> None:
    policies_path = "deployment.authentication.policies"
    for client_id, policy in loaded.policies.items():
        workflows_path = key(key(policies_path, client_id), "workflows")
        for position, workflow_id in enumerate(policy.workflows or ()):
            if workflow_id not in packages:
                problems.add(
                    ConfigInvalid(
                        index(workflows_path, position),
                        f"workflow '{workflow_id}' is not pinned in {_PACKAGES}",
                    )
                )


def _check_event_sources(
    loaded: Loaded, packages: dict[str, VerifiedPackage], problems: Problems
) -> None:
    for name, event_source in loaded.event_sources.items():
        if event_source.workflow not in packages:
            problems.add(
                ConfigInvalid(
                    key(key("eventSources", name), "workflow"),
                    f"workflow '{event_source.workflow}' is not pinned in {_PACKAGES}",
                )
            )
