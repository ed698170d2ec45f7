"""deployment.internal.metricsPort: each component's own metrics listener (TCP only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.config import check_runtime_file
from tests.helpers.runtime_files import assert_refused_at, complete_runtime, put, write_runtime

TLS = {
    "certificateRef": "secret:file/internal.crt",
    "privateKeyRef": "secret:file/internal.key",
    "trustedRootCertificateRef": "secret:file/internal-ca.pem",
}
SPREAD = {"admission": "10.0.0.5:7101", "recovery": "10.0.0.6:7102", "auditd": "10.0.0.7:7104"}


def internal(**block: Any) -> Any:
    return put(("deployment", "internal"), block)


def test_each_component_on_its_own_host_may_serve_its_own_metrics(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    internal(addresses=SPREAD, tls=TLS, metricsPort=9109)(document, tmp_path)
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    settings = checked.config.deployment.internal
    assert settings is not None and settings.metrics_port == 9109
    assert "dispatcher" not in settings.addresses


@pytest.mark.parametrize(
    "block",
    [
        {"socketDir": "sockets", "metricsPort": 9109},
        {"addresses": {**SPREAD, "auditd": "10.0.0.6:7104"}, "tls": TLS, "metricsPort": 9109},
        {"addresses": SPREAD, "tls": TLS, "metricsPort": 7102},
        {"addresses": SPREAD, "tls": TLS, "metricsPort": 0},
    ],
    ids=["with-sockets", "two-on-one-host", "a-grpc-port", "out-of-range"],
)
def test_a_metrics_port_that_cannot_work_is_refused(tmp_path: Path, block: dict[str, Any]) -> None:
    assert_refused_at(tmp_path, internal(**block), "deployment.internal.metricsPort")
