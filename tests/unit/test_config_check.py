"""The offline check: every deployment-level rule refuses with its exact key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.config import check_runtime_file, load_runtime_file
from core.config.model import CASEWORK, MESSAGING
from core.errors import CoordinatorError, PackageInvalid
from core.secrets import SecretRef
from tests.helpers.packages import make_package
from tests.helpers.runtime_files import (
    DATABASE_ID,
    Mutation,
    assert_refused_at,
    complete_runtime,
    drop,
    put,
    refusal,
    write_runtime,
)

POLICY = ("deployment", "authentication", "policies")
POLICIES = "deployment.authentication.policies"
INTERNAL_TLS = {
    "certificateRef": "secret:file/internal.crt",
    "privateKeyRef": "secret:file/internal.key",
    "trustedRootCertificateRef": "secret:file/internal-root.pem",
}


def _same_workflow_twice(document: dict[str, Any], directory: Path) -> None:
    root, digest = make_package(
        directory / "more", "approval-notice", {"review": CASEWORK, "notices": MESSAGING}, "2.0.0"
    )
    document["deployment"]["packages"].append({"root": str(root), "expectedDigest": digest})


def _seventeen_packages(document: dict[str, Any], directory: Path) -> None:
    pins = document["deployment"]["packages"]
    while len(pins) < 17:
        pins.append(dict(pins[0]))


# Every case is refused with config.invalid at the key it edits, or at the path ``at`` names.
CASES: list[pytest.ParameterSet] = [
    # namespace
    refusal("namespace-prefix", put(("namespace",), "registry_prod")),
    refusal("namespace-upper", put(("namespace",), "coordinator_Prod")),
    refusal("namespace-empty-tail", put(("namespace",), "coordinator_")),
    refusal("namespace-64-bytes", put(("namespace",), "coordinator_" + "a" * 52)),
    refusal("namespace-type", put(("namespace",), 12)),
    # databaseId, runtimeRole
    refusal("database-id", put(("deployment", "databaseId"), "not-a-uuid")),
    refusal(
        "database-id-no-hyphens", put(("deployment", "databaseId"), DATABASE_ID.replace("-", ""))
    ),
    refusal("runtime-role", put(("deployment", "runtimeRole"), "Runtime Role")),
    # packages
    refusal("packages-none", put(("deployment", "packages"), [])),
    refusal("packages-17", _seventeen_packages, at="deployment.packages"),
    refusal("packages-same-workflow", _same_workflow_twice, at="deployment.packages[3]"),
    refusal(
        "package-digest-form", put(("deployment", "packages", 1, "expectedDigest"), "sha256:ABC")
    ),
    refusal("package-root-empty", put(("deployment", "packages", 2, "root"), "")),
    # listeners
    refusal("bind-any-v4", put(("deployment", "listener", "bind"), "0.0.0.0:8108")),
    refusal("bind-any-v6", put(("deployment", "listener", "bind"), "[::]:8108")),
    refusal("bind-public", put(("deployment", "listener", "bind"), "8.8.8.8:8108")),
    refusal("bind-cgnat", put(("deployment", "listener", "bind"), "100.64.0.1:8108")),
    refusal("bind-public-v6", put(("deployment", "listener", "bind"), "[2001:db8::1]:8108")),
    refusal("bind-no-port", put(("deployment", "listener", "bind"), "127.0.0.1")),
    refusal("bind-port-0", put(("deployment", "listener", "bind"), "127.0.0.1:0")),
    refusal("bind-port-big", put(("deployment", "listener", "bind"), "127.0.0.1:65536")),
    refusal("bind-v6-no-brackets", put(("deployment", "listener", "bind"), "::1:8108")),
    refusal("bind-hostname", put(("deployment", "listener", "bind"), "coordinator.internal:8108")),
    refusal("tls-termination", put(("deployment", "listener", "tlsTermination"), "none")),
    refusal("tls-termination-missing", drop(("deployment", "listener", "tlsTermination"))),
    refusal(
        "public-url-http",
        put(("deployment", "listener", "publicUrl"), "http://coordinator.example.org"),
    ),
    refusal("metrics-any", put(("deployment", "metricsListener", "bind"), "0.0.0.0:9108")),
    refusal("metrics-public", put(("deployment", "metricsListener", "bind"), "203.0.113.9:9108")),
    refusal(
        "metrics-same-as-listener", put(("deployment", "metricsListener", "bind"), "127.0.0.1:8108")
    ),
    # internal channel
    refusal(
        "internal-both",
        put(("deployment", "internal", "addresses"), {"admission": "10.0.0.5:7101"}),
    ),
    refusal("internal-empty", put(("deployment", "internal"), {})),
    refusal(
        "internal-addresses-without-tls",
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
        at="deployment.internal.tls",
    ),
    refusal(
        "internal-addresses-missing-component",
        put(
            ("deployment", "internal"),
            {
                "addresses": {"admission": "10.0.0.5:7101", "recovery": "10.0.0.5:7102"},
                "tls": INTERNAL_TLS,
            },
        ),
        at="deployment.internal.addresses.auditd",
    ),
    refusal(
        "internal-address-any",
        put(
            ("deployment", "internal"),
            {
                "addresses": {
                    "admission": "0.0.0.0:7101",
                    "recovery": "10.0.0.5:7102",
                    "auditd": "10.0.0.5:7103",
                },
                "tls": INTERNAL_TLS,
            },
        ),
        at="deployment.internal.addresses.admission",
    ),
    refusal(
        "internal-tls-with-sockets",
        put(("deployment", "internal", "tls"), {"certificateRef": "secret:file/x"}),
    ),
    # policies
    refusal(
        "policy-deployment-action-needs-operator",
        put((*POLICY, "intake-portal", "actions"), ["start", "doctor"]),
        at=f"{POLICIES}.intake-portal.actions[1]",
    ),
    refusal(
        "policy-deployment-only-with-workflows",
        put((*POLICY, "platform-operators", "workflows"), ["approval-notice"]),
    ),
    refusal("policy-run-actions-without-workflows", drop((*POLICY, "case-operators", "workflows"))),
    refusal("policy-workflows-empty", put((*POLICY, "case-operators", "workflows"), [])),
    refusal(
        "policy-workflow-not-packaged",
        put((*POLICY, "case-operators", "workflows"), ["approval-notice", "unpackaged"]),
        at=f"{POLICIES}.case-operators.workflows[1]",
    ),
    refusal(
        "policy-operator-start",
        put((*POLICY, "case-operators", "actions"), ["status", "start"]),
        at=f"{POLICIES}.case-operators.actions[1]",
    ),
    refusal(
        "policy-unknown-action",
        put((*POLICY, "intake-portal", "actions"), ["start", "delete"]),
        at=f"{POLICIES}.intake-portal.actions[1]",
    ),
    refusal("policy-no-actions", put((*POLICY, "intake-portal", "actions"), [])),
    refusal(
        "policy-action-twice",
        put((*POLICY, "intake-portal", "actions"), ["start", "start"]),
        at=f"{POLICIES}.intake-portal.actions[1]",
    ),
    refusal("policy-operator-type", put((*POLICY, "case-operators", "operator"), "yes")),
    refusal(
        "policy-client-id-space",
        put((*POLICY, "bad client"), {"actions": ["doctor"], "operator": True}),
    ),
    # keys
    refusal("active-state-key-unlisted", put(("deployment", "activeStateKey"), 3)),
    refusal("active-state-key-type", put(("deployment", "activeStateKey"), "2")),
    refusal("state-key-duplicate", put(("deployment", "stateKeys", 1, "version"), 1)),
    refusal("state-key-zero", put(("deployment", "stateKeys", 0, "version"), 0)),
    refusal("state-key-negative", put(("deployment", "stateKeys", 0, "version"), -1)),
    refusal("state-key-string", put(("deployment", "stateKeys", 0, "version"), "1")),
    refusal("state-key-bool", put(("deployment", "stateKeys", 0, "version"), True)),
    refusal("state-keys-none", put(("deployment", "stateKeys"), [])),
    # authentication
    refusal(
        "issuer-http", put(("deployment", "authentication", "issuer"), "http://issuer.example.org")
    ),
    refusal(
        "jwks-http-private",
        put(("deployment", "authentication", "signingKeys", "jwksUrl"), "http://10.0.0.1/jwks"),
    ),
    refusal(
        "jwks-both",
        put(
            ("deployment", "authentication", "signingKeys", "jwksRef"),
            "secret:file/issuer-jwks.json",
        ),
        at="deployment.authentication.signingKeys",
    ),
    refusal("jwks-neither", put(("deployment", "authentication", "signingKeys"), {})),
    refusal(
        "alg-none",
        put(("deployment", "authentication", "algorithms"), ["none"]),
        at="deployment.authentication.algorithms[0]",
    ),
    refusal(
        "alg-hs256",
        put(("deployment", "authentication", "algorithms"), ["RS256", "HS256"]),
        at="deployment.authentication.algorithms[1]",
    ),
    refusal(
        "alg-unknown",
        put(("deployment", "authentication", "algorithms"), ["RS256", "XY512"]),
        at="deployment.authentication.algorithms[1]",
    ),
    refusal("alg-empty", put(("deployment", "authentication", "algorithms"), [])),
    refusal("skew-high", put(("deployment", "authentication", "clockSkewSeconds"), 301)),
    refusal("skew-negative", put(("deployment", "authentication", "clockSkewSeconds"), -1)),
    refusal("audience-missing", drop(("deployment", "authentication", "audience"))),
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
def test_each_rule_refuses_with_its_key_path(tmp_path: Path, mutation: Mutation, path: str) -> None:
    assert_refused_at(tmp_path, mutation, path)


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
