"""compose.yaml has the shape the design card asks for (no Docker engine runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("gateway", "admission", "dispatcher", "recovery", "auditd")


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return document


def test_one_service_per_component_plus_postgres_17() -> None:
    services = compose()["services"]
    assert set(services) == {*COMPONENTS, "postgres"}
    assert services["postgres"]["image"] == "postgres:17"
    assert "ssl=on" in services["postgres"]["command"]


def test_each_component_runs_itself_and_never_migrates() -> None:
    services = compose()["services"]
    for name in COMPONENTS:
        command = services[name]["command"]
        assert command[-2:] == ["--component", name]
        assert "apply" not in command
        assert services[name]["stop_grace_period"] == "15s"


def test_only_the_gateway_publishes_a_port_and_only_on_loopback() -> None:
    services = compose()["services"]
    published = {name: s.get("ports", []) for name, s in services.items() if s.get("ports")}
    assert list(published) == ["gateway"]
    assert all(port.startswith("127.0.0.1:") for port in published["gateway"])


def test_components_share_the_socket_volume() -> None:
    services = compose()["services"]
    for name in COMPONENTS:
        assert "sockets:/run/registry-coordinator/sockets" in services[name]["volumes"]


def test_the_image_installs_both_console_scripts() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["coordinator"]' in dockerfile
    assert "pip install --no-cache-dir ." in dockerfile
    assert "USER coordinator" in dockerfile
