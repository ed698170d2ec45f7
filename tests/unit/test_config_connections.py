"""The offline check: references, connections, event sources and unknown keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.config import check_runtime_file
from core.errors import ConfigInvalid
from tests.helpers.packages import make_package
from tests.helpers.runtime_files import (
    Mutation,
    both,
    complete_runtime,
    drop,
    put,
    write_runtime,
)

POLICIES = "deployment.authentication.policies"


def _package_needing(connections: dict[str, str]) -> Mutation:
    def mutate(document: dict[str, Any], directory: Path) -> None:
        root, digest = make_package(directory / "more", "extra-needs", connections)
        document["deployment"]["packages"].append({"root": str(root), "expectedDigest": digest})

    return mutate


# (mutation, exact key path of the refusal). Every case is refused with config.invalid.
CONNECTION_CASES: list[Any] = [
    # references
    pytest.param(
        put(("deployment", "auditKeyRef"), "/run/secrets/audit-key"),
        "deployment.auditKeyRef",
        id="ref-plain-path",
    ),
    pytest.param(
        put(("deployment", "auditKeyRef"), "secret:file/../audit-key"),
        "deployment.auditKeyRef",
        id="ref-traversal",
    ),
    pytest.param(
        put(("deployment", "auditKeyRef"), "secret:file/.."),
        "deployment.auditKeyRef",
        id="ref-dotdot",
    ),
    pytest.param(
        put(("deployment", "auditKeyRef"), "secret:file/a/b"),
        "deployment.auditKeyRef",
        id="ref-slash",
    ),
    pytest.param(
        put(("deployment", "auditKeyRef"), "secret:file/" + "a" * 129),
        "deployment.auditKeyRef",
        id="ref-long",
    ),
    pytest.param(
        put(("deployment", "auditKeyRef"), "secret:vault/audit-key"),
        "deployment.auditKeyRef",
        id="ref-provider",
    ),
    pytest.param(
        put(("deployment", "admissionKeyRef"), "secret:env/1BAD"),
        "deployment.admissionKeyRef",
        id="ref-env-name",
    ),
    pytest.param(
        drop(("secretProviders", "environment")),
        "database.migrationUrlRef",
        id="ref-env-provider-disabled",
    ),
    pytest.param(
        drop(("secretProviders", "file")), "database.runtimeUrlRef", id="ref-file-provider-disabled"
    ),
    pytest.param(
        put(("deployment", "stateKeys", 1, "ref"), "secret:file/"),
        "deployment.stateKeys[1].ref",
        id="ref-empty-name",
    ),
    pytest.param(
        put(("connections", "notices", "authorization", "signingKeyRef"), {"file": "x"}),
        "connections.notices.authorization.signingKeyRef",
        id="ref-type",
    ),
    # connections against packages
    pytest.param(drop(("connections", "notices")), "connections.notices", id="connection-missing"),
    pytest.param(
        put(("connections", "notices", "type"), "scheduling"),
        "connections.notices.type",
        id="connection-wrong-type",
    ),
    pytest.param(
        put(("connections", "notices", "type"), "email"),
        "connections.notices.type",
        id="connection-unknown-type",
    ),
    pytest.param(
        _package_needing({"fresh": "breg-action"}),
        "connections.fresh",
        id="connection-missing-for-new-package",
    ),
    # per-type keys
    pytest.param(
        drop(("connections", "review", "producer")),
        "connections.review.producer",
        id="casework-producer-missing",
    ),
    pytest.param(
        put(("connections", "notices", "producer"), "coordinator"),
        "connections.notices.producer",
        id="messaging-producer",
    ),
    pytest.param(
        put(
            ("connections", "slots", "completion"),
            {"recipientBinding": "x", "bearerTokenRef": "secret:file/t"},
        ),
        "connections.slots.completion",
        id="scheduling-completion",
    ),
    pytest.param(
        put(("connections", "register", "resultCheckSeconds"), 900),
        "connections.register.resultCheckSeconds",
        id="breg-result-check",
    ),
    pytest.param(
        drop(("connections", "notices", "baseUrl")),
        "connections.notices.baseUrl",
        id="base-url-missing",
    ),
    pytest.param(
        drop(("connections", "notices", "profile")),
        "connections.notices.profile",
        id="profile-missing",
    ),
    pytest.param(
        put(("connections", "notices", "profile"), "a/b"),
        "connections.notices.profile",
        id="profile-slash",
    ),
    pytest.param(
        drop(("connections", "notices", "authorization")),
        "connections.notices.authorization",
        id="authorization-missing",
    ),
    pytest.param(
        drop(("connections", "notices", "type")), "connections.notices.type", id="type-missing"
    ),
    pytest.param(
        drop(("connections", "notices", "authorization", "clientId")),
        "connections.notices.authorization.clientId",
        id="client-id-missing",
    ),
    pytest.param(
        put(("connections", "notices", "authorization", "scopes"), []),
        "connections.notices.authorization.scopes",
        id="scopes-empty",
    ),
    pytest.param(
        put(("connections", "notices", "authorization", "scopes"), ["messages:send", "bad scope"]),
        "connections.notices.authorization.scopes[1]",
        id="scope-space",
    ),
    pytest.param(
        put(("connections", "notices", "authorization", "audience"), "not a uri"),
        "connections.notices.authorization.audience",
        id="audience-not-uri",
    ),
    pytest.param(
        drop(("connections", "review", "completion", "bearerTokenRef")),
        "connections.review.completion.bearerTokenRef",
        id="completion-token-missing",
    ),
    pytest.param(
        put(("connections", "review", "completion", "recipientBinding"), "coordinator v1"),
        "connections.review.completion.recipientBinding",
        id="binding-space",
    ),
    pytest.param(
        put(("connections", "review", "completion", "recipientBinding"), "b" * 257),
        "connections.review.completion.recipientBinding",
        id="binding-too-long",
    ),
    pytest.param(
        put(("connections", "review", "completion", "recipientBinding"), "bindé"),
        "connections.review.completion.recipientBinding",
        id="binding-non-ascii",
    ),
    pytest.param(
        put(("connections", "escalation", "completion", "recipientBinding"), "coordinator-v1"),
        "connections.escalation.completion.recipientBinding",
        id="binding-duplicate",
    ),
    pytest.param(
        put(("connections", "review", "resultCheckSeconds"), 59),
        "connections.review.resultCheckSeconds",
        id="result-check-low",
    ),
    pytest.param(
        put(("connections", "review", "resultCheckSeconds"), 86401),
        "connections.review.resultCheckSeconds",
        id="result-check-high",
    ),
    pytest.param(
        put(("connections", "review", "resultCheckSeconds"), 90.5),
        "connections.review.resultCheckSeconds",
        id="result-check-float",
    ),
    pytest.param(
        put(("connections", "review", "baseUrl"), "http://casework.example.org"),
        "connections.review.baseUrl",
        id="base-url-http",
    ),
    pytest.param(
        put(("connections", "review", "baseUrl"), "ftp://casework.example.org"),
        "connections.review.baseUrl",
        id="base-url-ftp",
    ),
    pytest.param(
        put(("connections", "review", "baseUrl"), "https://user:pw@casework.example.org"),
        "connections.review.baseUrl",
        id="base-url-credentials",
    ),
    pytest.param(
        put(("connections", "review", "baseUrl"), "https://casework.example.org/#x"),
        "connections.review.baseUrl",
        id="base-url-fragment",
    ),
    pytest.param(
        put(("connections", "review", "baseUrl"), "casework.example.org"),
        "connections.review.baseUrl",
        id="base-url-relative",
    ),
    pytest.param(
        put(("connections", "bad.name"), {}), "connections.bad.name", id="connection-name"
    ),
    # event sources
    pytest.param(
        put(("eventSources", "intake", "workflow"), "unpackaged"),
        "eventSources.intake.workflow",
        id="event-workflow-unpackaged",
    ),
    pytest.param(
        put(("eventSources", "bookings", "source"), "https://intake.example.org/applications"),
        "eventSources.bookings.source",
        id="event-source-duplicate",
    ),
    pytest.param(
        drop(("eventSources", "intake", "signingKeyRef")),
        "eventSources.intake.signingKeyRef",
        id="event-key-missing",
    ),
    # missing required keys
    pytest.param(drop(("namespace",)), "namespace", id="missing-namespace"),
    pytest.param(
        drop(("database", "runtimeUrlRef")), "database.runtimeUrlRef", id="missing-runtime-url"
    ),
    pytest.param(
        drop(("deployment", "runtimeRole")), "deployment.runtimeRole", id="missing-runtime-role"
    ),
    pytest.param(
        drop(("deployment", "auditFile")), "deployment.auditFile", id="missing-audit-file"
    ),
    pytest.param(
        drop(("secretProviders", "file", "root")),
        "secretProviders.file.root",
        id="missing-secret-root",
    ),
    pytest.param(
        put(("secretProviders", "environment"), None),
        "secretProviders.environment",
        id="environment-null",
    ),
    # unknown keys at several depths
    pytest.param(put(("extra",), 1), "extra", id="unknown-top"),
    pytest.param(
        put(("secretProviders", "file", "mode"), "0700"),
        "secretProviders.file.mode",
        id="unknown-file-provider",
    ),
    pytest.param(
        put(("secretProviders", "environment", "prefix"), "X_"),
        "secretProviders.environment.prefix",
        id="unknown-environment",
    ),
    pytest.param(put(("database", "url"), "postgresql://x"), "database.url", id="unknown-database"),
    pytest.param(
        put(("deployment", "listener", "port"), 8108),
        "deployment.listener.port",
        id="unknown-listener",
    ),
    pytest.param(
        put(("deployment", "packages", 1, "name"), "x"),
        "deployment.packages[1].name",
        id="unknown-package",
    ),
    pytest.param(
        put(("deployment", "stateKeys", 0, "active"), True),
        "deployment.stateKeys[0].active",
        id="unknown-state-key",
    ),
    pytest.param(
        put(("deployment", "authentication", "policies", "intake-portal", "scope"), "x"),
        f"{POLICIES}.intake-portal.scope",
        id="unknown-policy",
    ),
    pytest.param(
        put(("connections", "review", "authorization", "secret"), "x"),
        "connections.review.authorization.secret",
        id="unknown-authorization",
    ),
    pytest.param(
        put(("connections", "review", "completion", "url"), "https://x"),
        "connections.review.completion.url",
        id="unknown-completion",
    ),
    pytest.param(
        put(("eventSources", "intake", "key"), "x"),
        "eventSources.intake.key",
        id="unknown-event-source",
    ),
    # wrong container types
    pytest.param(put(("deployment",), []), "deployment", id="deployment-list"),
    pytest.param(put(("connections",), ["review"]), "connections", id="connections-list"),
    pytest.param(
        put(("deployment", "packages"), {"root": "x"}), "deployment.packages", id="packages-mapping"
    ),
    pytest.param(
        both(
            put(("deployment", "listener", "bind"), "[fd00::1]:8108"),
            put(("deployment", "metricsListener", "bind"), "[FD00::1]:8108"),
        ),
        "deployment.metricsListener.bind",
        id="metrics-same-v6-spelling",
    ),
]


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return complete_runtime(tmp_path)


@pytest.mark.parametrize(("mutation", "path"), CONNECTION_CASES)
def test_each_connection_rule_refuses_with_its_key_path(
    tmp_path: Path, document: dict[str, Any], mutation: Mutation, path: str
) -> None:
    mutation(document, tmp_path)
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(runtime)
    assert caught.value.code == "config.invalid"
    assert caught.value.path == path
    assert caught.value.cli_line().startswith(f"coordinator.config.invalid: {path}: ")
