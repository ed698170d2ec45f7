"""Loading the runtime file: defaults, paths, strict YAML, and what check never touches."""

from __future__ import annotations

import builtins
import io
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.config import check_runtime_file, load_runtime_file
from core.errors import ConfigInvalid
from core.secrets import SecretRef
from tests.helpers.runtime_files import (
    DATABASE_ID,
    complete_runtime,
    put,
    secret_refs,
    write_runtime,
)


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return complete_runtime(tmp_path)


def test_defaults_apply_when_optional_keys_are_absent(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    authentication = document["deployment"]["authentication"]
    del authentication["algorithms"], authentication["clockSkewSeconds"]
    del document["connections"]["review"]["resultCheckSeconds"]
    del document["connections"]["review"]["completion"]
    for name in ("metricsListener", "internal"):
        del document["deployment"][name]
    del document["eventSources"]
    config = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document)).config
    assert config.deployment.authentication.algorithms == ("RS256", "ES256")
    assert config.deployment.authentication.clock_skew_seconds == 60
    assert config.connections["review"].result_check_seconds == 900
    assert config.connections["review"].completion is None
    assert config.deployment.metrics_listener is None and config.deployment.internal is None
    assert dict(config.event_sources) == {}


def test_relative_paths_are_taken_from_the_runtime_files_folder(
    tmp_path: Path, document: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document)).config
    assert config.path == tmp_path / "runtime.yaml"
    assert config.secret_providers.file is not None
    assert config.secret_providers.file.root == tmp_path / "secrets"
    assert config.deployment.audit_file == tmp_path / "audit" / "audit.jsonl"
    assert config.deployment.packages[1].root == tmp_path / "packages" / "slot-booking-1.0.0"
    assert config.deployment.internal is not None
    assert config.deployment.internal.socket_dir == tmp_path / "sockets"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("deployment", "listener", "bind"), "[::1]:8108"),
        (("deployment", "listener", "bind"), "localhost:8108"),
        (("deployment", "listener", "bind"), "192.168.10.4:443"),
        (("deployment", "listener", "bind"), "172.31.255.1:8108"),
        (("deployment", "listener", "bind"), "169.254.10.1:8108"),
        (("deployment", "listener", "bind"), "[fd12:3456::1]:8108"),
        (("deployment", "listener", "bind"), "[fe80::1]:8108"),
        (("connections", "review", "baseUrl"), "http://127.0.0.1:9000"),
        (("connections", "review", "baseUrl"), "http://localhost:9000/casework"),
        (("connections", "review", "baseUrl"), "http://[::1]:9000"),
        (("deployment", "authentication", "issuer"), "http://127.0.0.1:9100"),
        (
            ("deployment", "authentication", "signingKeys", "jwksUrl"),
            "http://127.0.0.1:9100/jwks?v=1",
        ),
        (("deployment", "authentication", "algorithms"), ["ES256", "PS256", "EdDSA"]),
        (("deployment", "authentication", "clockSkewSeconds"), 0),
        (("connections", "review", "resultCheckSeconds"), 60),
        (("connections", "review", "resultCheckSeconds"), 86400),
        (("connections", "review", "completion", "recipientBinding"), "~" * 256),
        (("namespace",), "coordinator_" + "a" * 51),
        (("deployment", "databaseId"), DATABASE_ID.upper()),
    ],
)
def test_boundary_values_are_accepted(
    tmp_path: Path, document: dict[str, Any], field: tuple[Any, ...], value: Any
) -> None:
    put(field, value)(document, tmp_path)
    config = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document)).config
    assert config.deployment.database_id == DATABASE_ID  # stored lowercase whatever the spelling


def test_jwks_from_a_reference_and_internal_tcp_with_tls(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    document["deployment"]["authentication"]["signingKeys"] = {
        "jwksRef": "secret:file/issuer-jwks.json"
    }
    document["deployment"]["internal"] = {
        "addresses": {
            "admission": "10.0.0.5:7101",
            "recovery": "10.0.0.5:7102",
            "auditd": "10.0.0.5:7103",
            "dispatcher": "10.0.0.6:7104",
        },
        "tls": {
            "certificateRef": "secret:file/internal.crt",
            "privateKeyRef": "secret:file/internal.key",
            "trustedRootCertificateRef": "secret:env/INTERNAL_ROOT",
        },
    }
    config = check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document)).config
    internal = config.deployment.internal
    assert internal is not None and internal.socket_dir is None and internal.tls is not None
    assert str(internal.addresses["dispatcher"]) == "10.0.0.6:7104"
    assert config.deployment.authentication.signing_keys.jwks_url is None
    refs = dict(secret_refs(config))
    assert refs["deployment.authentication.signingKeys.jwksRef"] == SecretRef(
        "file", "issuer-jwks.json"
    )
    assert refs["deployment.internal.tls.trustedRootCertificateRef"] == SecretRef(
        "env", "INTERNAL_ROOT"
    )


def test_secret_refs_lists_every_reference_with_its_key_path(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    refs = secret_refs(config)
    paths = [path for path, _ in refs]
    assert len(paths) == len(set(paths)) == 16
    assert ("deployment.stateKeys[1].ref", SecretRef("file", "state-key-2")) in refs
    assert (
        "connections.escalation.completion.bearerTokenRef",
        SecretRef("file", "escalation-completion-token"),
    ) in refs
    assert config.state_key(1) is not None and config.state_key(3) is None


# -- YAML strictness and the file itself -------------------------------------------------


def _valid_text(tmp_path: Path, document: dict[str, Any]) -> str:
    return write_runtime(tmp_path / "base.yaml", document).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("namespace: coordinator_test", "namespace: &ns coordinator_test"),
        ("runtimeRole: coordinator_runtime", "runtimeRole: !secret coordinator_runtime"),
        ("runtimeRole: coordinator_runtime", "runtimeRole: !!str coordinator_runtime"),
        (
            "namespace: coordinator_test",
            "namespace: coordinator_test\nnamespace: coordinator_other",
        ),
        (
            "runtimeRole: coordinator_runtime",
            "runtimeRole: coordinator_runtime\n  runtimeRole: coordinator_x",
        ),
        (
            "namespace: coordinator_test",
            "namespace: coordinator_test\n---\nnamespace: coordinator_test",
        ),
        ("namespace: coordinator_test", "namespace: [coordinator_test"),
    ],
    ids=[
        "anchor",
        "secret-tag",
        "str-tag",
        "duplicate-top",
        "duplicate-nested",
        "two-documents",
        "syntax",
    ],
)
def test_yaml_that_is_not_plain_data_is_refused(
    tmp_path: Path, document: dict[str, Any], old: str, new: str
) -> None:
    text = _valid_text(tmp_path, document)
    assert old in text
    runtime = tmp_path / "runtime.yaml"
    runtime.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigInvalid) as caught:
        load_runtime_file(runtime)
    assert caught.value.code == "config.invalid"


def test_an_alias_is_refused(tmp_path: Path, document: dict[str, Any]) -> None:
    text = _valid_text(tmp_path, document)
    text = text.replace("namespace: coordinator_test", "namespace: &ns coordinator_test")
    text = text.replace("runtimeRole: coordinator_runtime", "runtimeRole: *ns")
    runtime = tmp_path / "runtime.yaml"
    runtime.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigInvalid, match=r"alias|anchor"):
        load_runtime_file(runtime)


def test_duplicate_key_names_its_path(tmp_path: Path, document: dict[str, Any]) -> None:
    text = _valid_text(tmp_path, document).replace(
        "runtimeRole: coordinator_runtime",
        "runtimeRole: coordinator_runtime\n  runtimeRole: coordinator_x",
    )
    runtime = tmp_path / "runtime.yaml"
    runtime.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigInvalid) as caught:
        load_runtime_file(runtime)
    assert caught.value.path == "deployment.runtimeRole"


@pytest.mark.parametrize("content", [b"", b"# nothing\n", b"- a list\n", b"\xff\xfe not utf-8"])
def test_an_empty_or_non_mapping_file_is_refused(tmp_path: Path, content: bytes) -> None:
    runtime = tmp_path / "runtime.yaml"
    runtime.write_bytes(content)
    with pytest.raises(ConfigInvalid):
        load_runtime_file(runtime)


def test_a_missing_runtime_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load_runtime_file(tmp_path / "absent.yaml")
    assert "absent.yaml" in caught.value.detail


def test_refusals_do_not_repeat_the_value(tmp_path: Path, document: dict[str, Any]) -> None:
    document["deployment"]["runtimeRole"] = "s3cr3t-Value-That-Must-Not-Leak"
    with pytest.raises(ConfigInvalid) as caught:
        check_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert "s3cr3t" not in str(caught.value)


# -- check touches no secret and no network ---------------------------------------------


def _populate_secret_root(root: Path) -> None:
    root.mkdir()
    for name in ("audit-key", "admission-key", "state-key-1", "state-key-2", "runtime-db-url"):
        path = root / name
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)


def _guard_paths(monkeypatch: pytest.MonkeyPatch, forbidden: Path, touched: list[str]) -> None:
    """Make every path-based file system call fail for paths under ``forbidden``."""
    prefix = os.path.abspath(forbidden)

    def under(target: Any) -> bool:
        if isinstance(target, int):
            return False
        text = os.path.abspath(os.fsdecode(target))
        return text == prefix or text.startswith(prefix + os.sep)

    def guard(original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def wrapper(target: Any, *args: Any, **kwargs: Any) -> Any:
            if under(target):
                touched.append(f"{name}({target})")
                raise PermissionError(13, "secret root touched", str(target))
            return original(target, *args, **kwargs)

        return wrapper

    for module, name in [
        (builtins, "open"),
        (io, "open"),
        (os, "open"),
        (os, "stat"),
        (os, "lstat"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "access"),
        (os, "readlink"),
    ]:
        monkeypatch.setattr(module, name, guard(getattr(module, name), f"{module.__name__}.{name}"))


@pytest.mark.parametrize("state", ["populated", "mode-000", "missing", "empty"])
def test_check_never_touches_the_secret_root(
    tmp_path: Path, document: dict[str, Any], monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    root = tmp_path / "secrets"
    if state in ("populated", "mode-000"):
        _populate_secret_root(root)
    if state == "mode-000":
        root.chmod(0o000)
    if state == "empty":
        root.mkdir()
    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    touched: list[str] = []
    _guard_paths(monkeypatch, root, touched)
    checked = check_runtime_file(runtime)
    monkeypatch.undo()
    root_exists = root.exists()
    if state == "mode-000":
        root.chmod(0o700)
    assert touched == []
    assert checked.config.secret_providers.file is not None
    assert checked.config.secret_providers.file.root == root
    assert root_exists == (state != "missing")


def test_the_guard_itself_catches_a_secret_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "secrets"
    _populate_secret_root(root)
    touched: list[str] = []
    _guard_paths(monkeypatch, root, touched)
    with pytest.raises(PermissionError):
        (root / "audit-key").read_bytes()
    with pytest.raises(PermissionError):
        os.open(root / "audit-key", os.O_RDONLY)
    assert len(touched) == 2


def test_check_contacts_no_network(
    tmp_path: Path, document: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            attempts.append(name)
            raise OSError("network use during check")

        return fail

    runtime = write_runtime(tmp_path / "runtime.yaml", document)
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "gethostbyname", refuse("gethostbyname"))
    checked = check_runtime_file(runtime)
    assert attempts == []
    assert checked.config.connections["review"].base_url.startswith("https://")
    with pytest.raises(OSError, match="network use"):
        socket.getaddrinfo("issuer.example.org", 443)
    assert attempts == ["getaddrinfo"]


def test_a_socket_dir_too_long_for_unix_sockets_is_refused(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    fits = "/run/" + "s" * (91 - len("/run/"))
    document["deployment"]["internal"] = {"socketDir": fits}
    path = write_runtime(tmp_path / "runtime.yaml", document)
    assert str(load_runtime_file(path).deployment.internal.socket_dir) == fits  # type: ignore[union-attr]
    document["deployment"]["internal"] = {"socketDir": fits + "x"}
    path = write_runtime(tmp_path / "runtime.yaml", document)
    with pytest.raises(ConfigInvalid) as refused:
        load_runtime_file(path)
    assert refused.value.path == "deployment.internal.socketDir"
