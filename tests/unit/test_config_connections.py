"""The offline check: references, connections, event sources and unknown keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.packages import make_package
from tests.helpers.runtime_files import Mutation, assert_refused_at, both, drop, put, refusal


def _package_needing(connections: dict[str, str]) -> Mutation:
    def mutate(document: dict[str, Any], directory: Path) -> None:
        root, digest = make_package(directory / "more", "extra-needs", connections)
        document["deployment"]["packages"].append({"root": str(root), "expectedDigest": digest})

    return mutate


# Every case is refused with config.invalid at the key it edits, or at the path ``at`` names.
CONNECTION_CASES: list[pytest.ParameterSet] = [
    # references
    refusal("ref-plain-path", put(("deployment", "auditKeyRef"), "/run/secrets/audit-key")),
    refusal("ref-traversal", put(("deployment", "auditKeyRef"), "secret:file/../audit-key")),
    refusal("ref-dotdot", put(("deployment", "auditKeyRef"), "secret:file/..")),
    refusal("ref-slash", put(("deployment", "auditKeyRef"), "secret:file/a/b")),
    refusal("ref-long", put(("deployment", "auditKeyRef"), "secret:file/" + "a" * 129)),
    refusal("ref-provider", put(("deployment", "auditKeyRef"), "secret:vault/audit-key")),
    refusal("ref-env-name", put(("deployment", "admissionKeyRef"), "secret:env/1BAD")),
    refusal(
        "ref-env-provider-disabled",
        drop(("secretProviders", "environment")),
        at="database.migrationUrlRef",
    ),
    refusal(
        "ref-file-provider-disabled", drop(("secretProviders", "file")), at="database.runtimeUrlRef"
    ),
    refusal("ref-empty-name", put(("deployment", "stateKeys", 1, "ref"), "secret:file/")),
    refusal(
        "ref-type", put(("connections", "notices", "authorization", "signingKeyRef"), {"file": "x"})
    ),
    # connections against packages
    refusal("connection-missing", drop(("connections", "notices"))),
    refusal("connection-wrong-type", put(("connections", "notices", "type"), "scheduling")),
    refusal("connection-unknown-type", put(("connections", "notices", "type"), "email")),
    refusal(
        "connection-missing-for-new-package",
        _package_needing({"fresh": "breg-action"}),
        at="connections.fresh",
    ),
    # per-type keys
    refusal("casework-producer-missing", drop(("connections", "review", "producer"))),
    refusal("messaging-producer", put(("connections", "notices", "producer"), "coordinator")),
    refusal(
        "scheduling-completion",
        put(
            ("connections", "slots", "completion"),
            {"recipientBinding": "x", "bearerTokenRef": "secret:file/t"},
        ),
    ),
    refusal("breg-result-check", put(("connections", "register", "resultCheckSeconds"), 900)),
    refusal("base-url-missing", drop(("connections", "notices", "baseUrl"))),
    refusal("profile-missing", drop(("connections", "notices", "profile"))),
    refusal("profile-slash", put(("connections", "notices", "profile"), "a/b")),
    refusal("authorization-missing", drop(("connections", "notices", "authorization"))),
    refusal("type-missing", drop(("connections", "notices", "type"))),
    refusal("client-id-missing", drop(("connections", "notices", "authorization", "clientId"))),
    refusal("scopes-empty", put(("connections", "notices", "authorization", "scopes"), [])),
    refusal(
        "scope-space",
        put(("connections", "notices", "authorization", "scopes"), ["messages:send", "bad scope"]),
        at="connections.notices.authorization.scopes[1]",
    ),
    refusal(
        "audience-not-uri",
        put(("connections", "notices", "authorization", "audience"), "not a uri"),
    ),
    refusal(
        "completion-token-missing", drop(("connections", "review", "completion", "bearerTokenRef"))
    ),
    refusal(
        "binding-space",
        put(("connections", "review", "completion", "recipientBinding"), "coordinator v1"),
    ),
    refusal(
        "binding-too-long",
        put(("connections", "review", "completion", "recipientBinding"), "b" * 257),
    ),
    refusal(
        "binding-non-ascii",
        put(("connections", "review", "completion", "recipientBinding"), "bindé"),
    ),
    refusal(
        "binding-duplicate",
        put(("connections", "escalation", "completion", "recipientBinding"), "coordinator-v1"),
    ),
    refusal("result-check-low", put(("connections", "review", "resultCheckSeconds"), 59)),
    refusal("result-check-high", put(("connections", "review", "resultCheckSeconds"), 86401)),
    refusal("result-check-float", put(("connections", "review", "resultCheckSeconds"), 90.5)),
    refusal(
        "base-url-http", put(("connections", "review", "baseUrl"), "http://casework.example.org")
    ),
    refusal(
        "base-url-ftp", put(("connections", "review", "baseUrl"), "ftp://casework.example.org")
    ),
    refusal(
        "base-url-credentials",
        put(("connections", "review", "baseUrl"), "https://user:pw@casework.example.org"),
    ),
    refusal(
        "base-url-fragment",
        put(("connections", "review", "baseUrl"), "https://casework.example.org/#x"),
    ),
    refusal("base-url-relative", put(("connections", "review", "baseUrl"), "casework.example.org")),
    refusal("connection-name", put(("connections", "bad.name"), {})),
    # event sources
    refusal("event-workflow-unpackaged", put(("eventSources", "intake", "workflow"), "unpackaged")),
    refusal(
        "event-source-duplicate",
        put(("eventSources", "bookings", "source"), "https://intake.example.org/applications"),
    ),
    refusal("event-key-missing", drop(("eventSources", "intake", "signingKeyRef"))),
    # missing required keys
    refusal("missing-namespace", drop(("namespace",))),
    refusal("missing-runtime-url", drop(("database", "runtimeUrlRef"))),
    refusal("missing-runtime-role", drop(("deployment", "runtimeRole"))),
    refusal("missing-audit-file", drop(("deployment", "auditFile"))),
    refusal("missing-secret-root", drop(("secretProviders", "file", "root"))),
    refusal("environment-null", put(("secretProviders", "environment"), None)),
    # unknown keys at several depths
    refusal("unknown-top", put(("extra",), 1)),
    refusal("unknown-file-provider", put(("secretProviders", "file", "mode"), "0700")),
    refusal("unknown-environment", put(("secretProviders", "environment", "prefix"), "X_")),
    refusal("unknown-database", put(("database", "url"), "postgresql://x")),
    refusal("unknown-listener", put(("deployment", "listener", "port"), 8108)),
    refusal("unknown-package", put(("deployment", "packages", 1, "name"), "x")),
    refusal("unknown-state-key", put(("deployment", "stateKeys", 0, "active"), True)),
    refusal(
        "unknown-policy",
        put(("deployment", "authentication", "policies", "intake-portal", "scope"), "x"),
    ),
    refusal(
        "unknown-authorization", put(("connections", "review", "authorization", "secret"), "x")
    ),
    refusal("unknown-completion", put(("connections", "review", "completion", "url"), "https://x")),
    refusal("unknown-event-source", put(("eventSources", "intake", "key"), "x")),
    # wrong container types
    refusal("deployment-list", put(("deployment",), [])),
    refusal("connections-list", put(("connections",), ["review"])),
    refusal("packages-mapping", put(("deployment", "packages"), {"root": "x"})),
    refusal(
        "metrics-same-v6-spelling",
        both(
            put(("deployment", "listener", "bind"), "[fd00::1]:8108"),
            put(("deployment", "metricsListener", "bind"), "[FD00::1]:8108"),
        ),
        at="deployment.metricsListener.bind",
    ),
]


@pytest.mark.parametrize(("mutation", "path"), CONNECTION_CASES)
def test_each_connection_rule_refuses_with_its_key_path(
    tmp_path: Path, mutation: Mutation, path: str
) -> None:
    assert_refused_at(tmp_path, mutation, path)
