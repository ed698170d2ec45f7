"""The offline check: every deployment-level rule refuses with its exact key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.config import check_runtime_file, load_runtime_file
from core.config.model import CASEWORK, MESSAGING
from core.errors import ConfigInvalid, CoordinatorError, PackageInvalid
from core.secrets import SecretRef
from tests.helpers.packages import make_package
from tests.helpers.runtime_files import (
    DATABASE_ID,
    Mutation,
    complete_runtime,
    drop,
    put,
    write_runtime,
)

POLICIES = "deployment.authentication.policies"


def _same_workflow_twice(document: dict[str, Any], directory: Path) -> None:
    root, digest = make_package(
        directory / "more", "approval-notice", {"review": CASEWORK, "notices": MESSAGING}, "2.0.0"
    )
    document["deployment"]["packages"].append({"root": str(root), "expectedDigest": digest})


def _seventeen_packages(document: dict[str, Any], directory: Path) -> None:
    pins = document["deployment"]["packages"]
    while len(pins) < 17:
        pins.append(dict(pins[0]))


# (mutation, exact key path of the refusal). Every case is refused with config.invalid.
CASES: list[Any] = [
    # namespace
    pytest.param(put(("namespace",), "registry_prod"), "namespace", id="namespace-prefix"),
    pytest.param(put(("namespace",), "coordinator_Prod"), "namespace", id="namespace-upper"),
    pytest.param(put(("namespace",), "coordinator_"), "namespace", id="namespace-empty-tail"),
    pytest.param(
        put(("namespace",), "coordinator_" + "a" * 52), "namespace", id="namespace-64-bytes"
    ),
    pytest.param(put(("namespace",), 12), "namespace", id="namespace-type"),
    # databaseId, runtimeRole
    pytest.param(
        put(("deployment", "databaseId"), "not-a-uuid"), "deployment.databaseId", id="database-id"
    ),
    pytest.param(
        put(("deployment", "databaseId"), DATABASE_ID.replace("-", "")),
        "deployment.databaseId",
        id="database-id-no-hyphens",
    ),
    pytest.param(
        put(("deployment", "runtimeRole"), "Runtime Role"),
        "deployment.runtimeRole",
        id="runtime-role",
    ),
    # packages
    pytest.param(put(("deployment", "packages"), []), "deployment.packages", id="packages-none"),
    pytest.param(_seventeen_packages, "deployment.packages", id="packages-17"),
    pytest.param(_same_workflow_twice, "deployment.packages[3]", id="packages-same-workflow"),
    pytest.param(
        put(("deployment", "packages", 1, "expectedDigest"), "sha256:ABC"),
        "deployment.packages[1].expectedDigest",
        id="package-digest-form",
    ),
    pytest.param(
        put(("deployment", "packages", 2, "root"), ""),
        "deployment.packages[2].root",
        id="package-root-empty",
    ),
    # listeners
    pytest.param(
        put(("deployment", "listener", "bind"), "0.0.0.0:8108"),
        "deployment.listener.bind",
        id="bind-any-v4",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "[::]:8108"),
        "deployment.listener.bind",
        id="bind-any-v6",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "8.8.8.8:8108"),
        "deployment.listener.bind",
        id="bind-public",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "100.64.0.1:8108"),
        "deployment.listener.bind",
        id="bind-cgnat",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "[2001:db8::1]:8108"),
        "deployment.listener.bind",
        id="bind-public-v6",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "127.0.0.1"),
        "deployment.listener.bind",
        id="bind-no-port",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "127.0.0.1:0"),
        "deployment.listener.bind",
        id="bind-port-0",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "127.0.0.1:65536"),
        "deployment.listener.bind",
        id="bind-port-big",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "::1:8108"),
        "deployment.listener.bind",
        id="bind-v6-no-brackets",
    ),
    pytest.param(
        put(("deployment", "listener", "bind"), "coordinator.internal:8108"),
        "deployment.listener.bind",
        id="bind-hostname",
    ),
    pytest.param(
        put(("deployment", "listener", "tlsTermination"), "none"),
        "deployment.listener.tlsTermination",
        id="tls-termination",
    ),
    pytest.param(
        drop(("deployment", "listener", "tlsTermination")),
        "deployment.listener.tlsTermination",
        id="tls-termination-missing",
    ),
    pytest.param(
        put(("deployment", "listener", "publicUrl"), "http://coordinator.example.org"),
        "deployment.listener.publicUrl",
        id="public-url-http",
    ),
    pytest.param(
        put(("deployment", "metricsListener", "bind"), "0.0.0.0:9108"),
        "deployment.metricsListener.bind",
        id="metrics-any",
    ),
    pytest.param(
        put(("deployment", "metricsListener", "bind"), "203.0.113.9:9108"),
        "deployment.metricsListener.bind",
        id="metrics-public",
    ),
    pytest.param(
        put(("deployment", "metricsListener", "bind"), "127.0.0.1:8108"),
        "deployment.metricsListener.bind",
        id="metrics-same-as-listener",
    ),
    # internal channel
    pytest.param(
        put(("deployment", "internal", "addresses"), {"admission": "10.0.0.5:7101"}),
        "deployment.internal.addresses",
        id="internal-both",
    ),
    pytest.param(put(("deployment", "internal"), {}), "deployment.internal", id="internal-empty"),
    pytest.param(
        put(
            ("deployment", "internal"),
            {
                "addresses": {
                    "admission": "10.0.0.5:7101",
                    "recovery": "10.0.0.5:7102",
                    "auditd": "10.0.0.5:7103",
                }
            },
        ),
        "deployment.internal.tls",
        id="internal-addresses-without-tls",
    ),
    pytest.param(
        put(
            ("deployment", "internal"),
            {
                "addresses": {"admission": "10.0.0.5:7101", "recovery": "10.0.0.5:7102"},
                "tls": {
                    "certificateRef": "secret:file/internal.crt",
                    "privateKeyRef": "secret:file/internal.key",
                    "trustedRootCertificateRef": "secret:file/internal-root.pem",
                },
            },
        ),
        "deployment.internal.addresses.auditd",
        id="internal-addresses-missing-component",
    ),
    pytest.param(
        put(
            ("deployment", "internal"),
            {
                "addresses": {
                    "admission": "0.0.0.0:7101",
                    "recovery": "10.0.0.5:7102",
                    "auditd": "10.0.0.5:7103",
                },
                "tls": {
                    "certificateRef": "secret:file/internal.crt",
                    "privateKeyRef": "secret:file/internal.key",
                    "trustedRootCertificateRef": "secret:file/internal-root.pem",
                },
            },
        ),
        "deployment.internal.addresses.admission",
        id="internal-address-any",
    ),
    pytest.param(
        put(("deployment", "internal", "tls"), {"certificateRef": "secret:file/x"}),
        "deployment.internal.tls",
        id="internal-tls-with-sockets",
    ),
    # policies
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "intake-portal", "actions"),
            ["start", "doctor"],
        ),
        f"{POLICIES}.intake-portal.actions[1]",
        id="policy-deployment-action-needs-operator",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "platform-operators", "workflows"),
            ["approval-notice"],
        ),
        f"{POLICIES}.platform-operators.workflows",
        id="policy-deployment-only-with-workflows",
    ),
    pytest.param(
        drop(("deployment", "authentication", "policies", "case-operators", "workflows")),
        f"{POLICIES}.case-operators.workflows",
        id="policy-run-actions-without-workflows",
    ),
    pytest.param(
        put(("deployment", "authentication", "policies", "case-operators", "workflows"), []),
        f"{POLICIES}.case-operators.workflows",
        id="policy-workflows-empty",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "case-operators", "workflows"),
            ["approval-notice", "unpackaged"],
        ),
        f"{POLICIES}.case-operators.workflows[1]",
        id="policy-workflow-not-packaged",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "case-operators", "actions"),
            ["status", "start"],
        ),
        f"{POLICIES}.case-operators.actions[1]",
        id="policy-operator-start",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "intake-portal", "actions"),
            ["start", "delete"],
        ),
        f"{POLICIES}.intake-portal.actions[1]",
        id="policy-unknown-action",
    ),
    pytest.param(
        put(("deployment", "authentication", "policies", "intake-portal", "actions"), []),
        f"{POLICIES}.intake-portal.actions",
        id="policy-no-actions",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "intake-portal", "actions"),
            ["start", "start"],
        ),
        f"{POLICIES}.intake-portal.actions[1]",
        id="policy-action-twice",
    ),
    pytest.param(
        put(("deployment", "authentication", "policies", "case-operators", "operator"), "yes"),
        f"{POLICIES}.case-operators.operator",
        id="policy-operator-type",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "policies", "bad client"),
            {"actions": ["doctor"], "operator": True},
        ),
        f"{POLICIES}.bad client",
        id="policy-client-id-space",
    ),
    # keys
    pytest.param(
        put(("deployment", "activeStateKey"), 3),
        "deployment.activeStateKey",
        id="active-state-key-unlisted",
    ),
    pytest.param(
        put(("deployment", "activeStateKey"), "2"),
        "deployment.activeStateKey",
        id="active-state-key-type",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 1, "version"), 1),
        "deployment.stateKeys[1].version",
        id="state-key-duplicate",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 0, "version"), 0),
        "deployment.stateKeys[0].version",
        id="state-key-zero",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 0, "version"), -1),
        "deployment.stateKeys[0].version",
        id="state-key-negative",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 0, "version"), "1"),
        "deployment.stateKeys[0].version",
        id="state-key-string",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 0, "version"), True),
        "deployment.stateKeys[0].version",
        id="state-key-bool",
    ),
    pytest.param(
        put(("deployment", "stateKeys"), []), "deployment.stateKeys", id="state-keys-none"
    ),
    # authentication
    pytest.param(
        put(("deployment", "authentication", "issuer"), "http://issuer.example.org"),
        "deployment.authentication.issuer",
        id="issuer-http",
    ),
    pytest.param(
        put(("deployment", "authentication", "signingKeys", "jwksUrl"), "http://10.0.0.1/jwks"),
        "deployment.authentication.signingKeys.jwksUrl",
        id="jwks-http-private",
    ),
    pytest.param(
        put(
            ("deployment", "authentication", "signingKeys", "jwksRef"),
            "secret:file/issuer-jwks.json",
        ),
        "deployment.authentication.signingKeys",
        id="jwks-both",
    ),
    pytest.param(
        put(("deployment", "authentication", "signingKeys"), {}),
        "deployment.authentication.signingKeys",
        id="jwks-neither",
    ),
    pytest.param(
        put(("deployment", "authentication", "algorithms"), ["none"]),
        "deployment.authentication.algorithms[0]",
        id="alg-none",
    ),
    pytest.param(
        put(("deployment", "authentication", "algorithms"), ["RS256", "HS256"]),
        "deployment.authentication.algorithms[1]",
        id="alg-hs256",
    ),
    pytest.param(
        put(("deployment", "authentication", "algorithms"), ["RS256", "XY512"]),
        "deployment.authentication.algorithms[1]",
        id="alg-unknown",
    ),
    pytest.param(
        put(("deployment", "authentication", "algorithms"), []),
        "deployment.authentication.algorithms",
        id="alg-empty",
    ),
    pytest.param(
        put(("deployment", "authentication", "clockSkewSeconds"), 301),
        "deployment.authentication.clockSkewSeconds",
        id="skew-high",
    ),
    pytest.param(
        put(("deployment", "authentication", "clockSkewSeconds"), -1),
        "deployment.authentication.clockSkewSeconds",
        id="skew-negative",
    ),
    pytest.param(
        drop(("deployment", "authentication", "audience")),
        "deployment.authentication.audience",
        id="audience-missing",
    ),
]


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return complete_runtime(tmp_path)


def test_complete_file_passes(tmp_path: Path, document: dict[str, Any]) -> None:
    checked = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    config = checked.config
    assert list(checked.packages) == ["approval-notice", "slot-booking", "escalation"]
    assert checked.packages["slot-booking"].connections == {
        "slots": "scheduling",
        "register": "breg-action",
    }
    assert config.namespace == "coordinator_test"
    assert config.deployment.database_id == DATABASE_ID
    assert config.deployment.active_state_key == 2
    assert [key.version for key in config.deployment.state_keys] == [1, 2]
    assert str(config.deployment.listener.bind) == "127.0.0.1:8108"
    assert config.deployment.authentication.clock_skew_seconds == 30
    platform = config.deployment.authentication.policies["platform-operators"]
    assert platform.operator is True and platform.workflows is None
    review = config.connections["review"]
    assert review.result_check_seconds == 600
    assert review.completion is not None and review.completion.recipient_binding == "coordinator-v1"
    assert config.connections["escalation"].result_check_seconds == 900
    assert config.connections["notices"].result_check_seconds is None
    assert config.connections["notices"].producer is None
    assert config.connections["notices"].token_audience == "https://messaging.internal.example.org"
    assert config.database.migration_url_ref == SecretRef("env", "COORDINATOR_MIGRATION_URL")
    assert config.event_sources["bookings"].workflow == "slot-booking"


@pytest.mark.parametrize(("mutation", "path"), CASES)
def test_each_rule_refuses_with_its_key_path(
    tmp_path: Path, document: dict[str, Any], mutation: Mutation, path: str
) -> None:
    mutation(document, tmp_path)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(runtime)
    assert caught.value.code == "config.invalid"
    assert caught.value.path == path
    assert caught.value.cli_line().startswith(f"coordinator.config.invalid: {path}: ")


# -- packages ---------------------------------------------------------------------------


def test_a_package_that_differs_from_its_digest_is_refused(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    other_root, other_digest = make_package(tmp_path / "other", "other", {})
    document["deployment"]["packages"][0]["expectedDigest"] = other_digest
    with pytest.raises(PackageInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert caught.value.code == "package.digest-mismatch"
    assert "approval-notice-1.0.0" in caught.value.path
    assert other_root.exists()


def test_a_tampered_package_file_is_refused(tmp_path: Path, document: dict[str, Any]) -> None:
    source = tmp_path / "packages" / "escalation-1.0.0" / "workflow.yaml"
    source.write_bytes(source.read_bytes() + b"# changed\n")
    with pytest.raises(PackageInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert caught.value.code in {"package.digest-mismatch", "package.invalid"}
    assert "escalation-1.0.0" in caught.value.path


def test_a_missing_package_root_is_refused(tmp_path: Path, document: dict[str, Any]) -> None:
    document["deployment"]["packages"][1]["root"] = "packages/nowhere"
    with pytest.raises(PackageInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert caught.value.code == "package.invalid"
    assert caught.value.path.endswith("packages/nowhere")


def test_load_alone_does_not_open_packages(tmp_path: Path, document: dict[str, Any]) -> None:
    document["deployment"]["packages"][1]["root"] = "packages/nowhere"
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert config.deployment.packages[1].root == tmp_path / "packages" / "nowhere"


def test_all_refusals_are_coordinator_errors(tmp_path: Path, document: dict[str, Any]) -> None:
    document["deployment"]["listener"]["bind"] = "0.0.0.0:8108"
    with pytest.raises(CoordinatorError) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert caught.value.cli_line() == (
        "coordinator.config.invalid: deployment.listener.bind: "
        "must not listen on every address (0.0.0.0 or ::)"
    )
