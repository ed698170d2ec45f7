"""The offline check of a runtime file and its packages (``coordinatorctl check``).

On top of everything :mod:`core.config.load` refuses, this verifies each pinned package
against its digest and applies the rules that join the file with the packages: one package
per workflow id, the connections each workflow needs, and the workflows that policies and
event sources name. It never opens a secret file, never resolves a host name and never
contacts an endpoint.
"""

from __future__ import annotations

from pathlib import Path

from core.config.load import load_runtime_file
from core.config.model import CheckedDeployment, RuntimeConfig
from core.errors import ConfigInvalid
from core.paths import index, key
from core.workflow.package import VerifiedPackage, verify_package


def check_runtime_file(path: Path) -> CheckedDeployment:
    """Load a runtime file, verify its packages and apply every rule; refuse on the first."""
    return check_config(load_runtime_file(path))


def check_config(config: RuntimeConfig) -> CheckedDeployment:
    """Verify the packages of a loaded runtime file and the rules that involve them."""
    packages = _verify_packages(config)
    _check_connections(config, packages)
    _check_policies(config, packages)
    _check_event_sources(config, packages)
    return CheckedDeployment(config=config, packages=packages)


def _verify_packages(config: RuntimeConfig) -> dict[str, VerifiedPackage]:
    packages: dict[str, VerifiedPackage] = {}
    positions: dict[str, int] = {}
    for position, pin in enumerate(config.deployment.packages):
        verified = verify_package(pin.root, pin.expected_digest)
        workflow_id = verified.workflow_id
        if workflow_id in packages:
            raise ConfigInvalid(
                index("deployment.packages", position),
                f"workflow '{workflow_id}' is already pinned by "
                f"deployment.packages[{positions[workflow_id]}]; one package per workflow",
            )
        packages[workflow_id] = verified
        positions[workflow_id] = position
    return packages


def _check_connections(config: RuntimeConfig, packages: dict[str, VerifiedPackage]) -> None:
    for workflow_id, package in packages.items():
        for name, needed_type in sorted(package.connections.items()):
            connection = config.connections.get(name)
            path = key("connections", name)
            if connection is None:
                raise ConfigInvalid(
                    path, f"workflow '{workflow_id}' needs a {needed_type} connection named {name}"
                )
            if connection.type != needed_type:
                raise ConfigInvalid(
                    key(path, "type"),
                    f"workflow '{workflow_id}' needs this connection to be {needed_type}",
                )


def _check_policies(config: RuntimeConfig, packages: dict[str, VerifiedPackage]) -> None:
    policies_path = "deployment.authentication.policies"
    for client_id, policy in config.deployment.authentication.policies.items():
        workflows_path = key(key(policies_path, client_id), "workflows")
        for position, workflow_id in enumerate(policy.workflows or ()):
            if workflow_id not in packages:
                raise ConfigInvalid(
                    index(workflows_path, position),
                    f"workflow '{workflow_id}' is not pinned in deployment.packages",
                )


def _check_event_sources(config: RuntimeConfig, packages: dict[str, VerifiedPackage]) -> None:
    for name, event_source in config.event_sources.items():
        if event_source.workflow not in packages:
            raise ConfigInvalid(
                key(key("eventSources", name), "workflow"),
                f"workflow '{event_source.workflow}' is not pinned in deployment.packages",
            )
