"""The local stack's generated runtime file passes the offline check and its secrets read."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from core.config import check_runtime_file
from core.keys import resolver_for
from devstack.runtime_file import write_local_deployment
from tests.helpers.packages import make_package

PORTS = {
    "listener": 18108,
    "metrics": 19108,
    "issuer": 18200,
    "casework-review-producer": 18301,
    "messaging": 18302,
    "scheduling": 18303,
    "breg-action": 18304,
}


@pytest.fixture
def packages(tmp_path: Path) -> list[tuple[Path, str]]:
    return [
        make_package(
            tmp_path / "packages",
            "approval-notice",
            {"review": "casework-review-producer", "notices": "messaging"},
        ),
        make_package(
            tmp_path / "packages",
            "slot-booking",
            {"slots": "scheduling", "register": "breg-action"},
        ),
    ]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_file_passes_check_and_its_secrets_resolve(
    tmp_path: Path, packages: list[tuple[Path, str]]
) -> None:
    stack = tmp_path / "stack"
    runtime = write_local_deployment(
        stack, packages=packages, database_secret_files=None, ports=PORTS
    )
    assert runtime == stack / "runtime.yaml"
    checked = check_runtime_file(runtime)
    config = checked.config
    assert sorted(checked.packages) == ["approval-notice", "slot-booking"]
    assert sorted(config.connections) == ["notices", "register", "review", "slots"]
    assert config.connections["review"].base_url == "http://127.0.0.1:18301"
    assert config.deployment.authentication.issuer == "http://127.0.0.1:18200"
    assert str(config.deployment.listener.bind) == "127.0.0.1:18108"
    assert config.deployment.metrics_listener is not None
    assert config.event_sources["intake"].workflow == "approval-notice"
    operator = config.deployment.authentication.policies["devstack-operator"]
    assert operator.operator and "doctor" in operator.actions and "start" not in operator.actions
    producer = config.deployment.authentication.policies["devstack-producer"]
    assert producer.actions == ("start", "status") and not producer.operator

    secret_dir = stack / "secrets"
    assert _mode(secret_dir) == 0o700
    assert _mode(stack / "sockets") == 0o700
    reader = resolver_for(config)
    keys = {
        reader.read_key(config.deployment.admission_key_ref),
        reader.read_key(config.deployment.audit_key_ref),
        reader.read_key(config.deployment.state_keys[0].ref),
    }
    assert len(keys) == 3
    assert len(reader.read_bytes(config.event_sources["intake"].signing_key_ref, min_len=32)) == 32
    completion = config.connections["review"].completion
    assert completion is not None
    assert len(reader.read_text(completion.bearer_token_ref, max_len=4096)) == 64
    public = json.loads((stack / "public" / "clients.json").read_text())
    for connection in config.connections.values():
        jwk = reader.read_jwk(connection.authorization.signing_key_ref)
        assert jwk["alg"] == "ES256" and jwk["crv"] == "P-256"
        published = public[connection.authorization.client_id]["keys"][0]
        assert published["kid"] == jwk["kid"]
        assert "d" not in published and published["x"] == jwk["x"]
    for secret in secret_dir.iterdir():
        assert _mode(secret) == 0o600
    summary = json.loads((stack / "devstack.json").read_text())
    assert summary["completions"]["review"]["recipientBinding"] == completion.recipient_binding
    assert summary["databaseId"] == config.deployment.database_id


def test_database_secret_files_are_copied_in(
    tmp_path: Path, packages: list[tuple[Path, str]]
) -> None:
    sources = tmp_path / "db"
    sources.mkdir()
    (sources / "runtime").write_text("postgresql://runtime@127.0.0.1/db?sslmode=require")
    (sources / "migration").write_text("postgresql://migrator@127.0.0.1/db?sslmode=require")
    files = {"runtime_url": sources / "runtime", "migration_url": sources / "migration"}
    runtime = write_local_deployment(
        tmp_path / "stack", packages=packages[1:], database_secret_files=files, ports=PORTS
    )
    config = check_runtime_file(runtime).config
    reader = resolver_for(config)
    assert reader.read_text(config.database.runtime_url_ref).startswith("postgresql://runtime@")
    assert reader.read_text(config.database.migration_url_ref).startswith("postgresql://migrator@")
    assert config.database.trusted_root_certificate_ref is None
    assert "review" not in config.connections


def test_refusals_before_anything_is_written(
    tmp_path: Path, packages: list[tuple[Path, str]]
) -> None:
    missing_type = {key: port for key, port in PORTS.items() if key != "messaging"}
    with pytest.raises(ValueError, match="messaging"):
        write_local_deployment(
            tmp_path / "a", packages=packages, database_secret_files=None, ports=missing_type
        )
    assert not (tmp_path / "a").exists()
    write_local_deployment(
        tmp_path / "b", packages=packages, database_secret_files=None, ports=PORTS
    )
    with pytest.raises(FileExistsError):
        write_local_deployment(
            tmp_path / "b", packages=packages, database_secret_files=None, ports=PORTS
        )
