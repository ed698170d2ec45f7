"""Secret references and the typed readers: what they accept and how they refuse."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from core.codes import Code
from core.config import load_runtime_file
from core.errors import ConfigInvalid
from core.keys import resolver_for
from core.secrets import SecretError, SecretRef, SecretResolver, parse_reference
from tests.helpers.runtime_files import complete_runtime, write_runtime

KEY = bytes(range(32))
CONTENT_MARKER = "do-not-echo-this-content"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    return folder


def put_secret(root: Path, name: str, data: bytes, mode: int = 0o600) -> Path:
    path = root / name
    path.write_bytes(data)
    path.chmod(mode)
    return path


def resolver(root: Path | None, **kwargs: Any) -> SecretResolver:
    kwargs.setdefault("environment", False)
    return SecretResolver(file_root=root, **kwargs)


def es256_jwk(kid: str = "review-1") -> dict[str, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = ECAlgorithm.to_jwk(key, as_dict=True)
    return {**jwk, "kid": kid, "alg": "ES256"}


def rs256_jwk(kid: str = "notices-1") -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = RSAAlgorithm.to_jwk(key, as_dict=True)
    return {**jwk, "kid": kid, "alg": "RS256"}


# -- reference syntax --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("secret:file/audit-key", SecretRef("file", "audit-key")),
        ("secret:file/review-client.jwk", SecretRef("file", "review-client.jwk")),
        ("secret:file/" + "a" * 128, SecretRef("file", "a" * 128)),
        ("secret:file/.hidden", SecretRef("file", ".hidden")),
        ("secret:env/COORDINATOR_DB_URL", SecretRef("env", "COORDINATOR_DB_URL")),
        ("secret:env/_x1", SecretRef("env", "_x1")),
    ],
)
def test_valid_references_parse_and_print_back(text: str, expected: SecretRef) -> None:
    ref = parse_reference(text, "some.key")
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize(
    "text",
    [
        "audit-key",
        "secret:audit-key",
        "secret:file/",
        "secret:file/.",
        "secret:file/..",
        "secret:file/a/b",
        "secret:file/../etc/passwd",
        "secret:file/" + "a" * 129,
        "secret:file/with space",
        "secret:file/ümlaut",
        "secret:env/",
        "secret:env/9LIVES",
        "secret:env/A-B",
        "secret:vault/key",
        "SECRET:file/audit-key",
        " secret:file/audit-key",
    ],
)
def test_bad_references_are_config_invalid_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse_reference(text, "deployment.auditKeyRef")
    assert caught.value.code == "config.invalid"
    assert caught.value.path == "deployment.auditKeyRef"


@pytest.mark.parametrize("value", [None, 7, ["secret:file/x"], {"file": "x"}])
def test_a_reference_must_be_a_string(value: object) -> None:
    with pytest.raises(ConfigInvalid, match="must be a secret reference string"):
        parse_reference(value, "x.ref")


# -- file provider -----------------------------------------------------------------------


def test_read_key_returns_exactly_32_bytes(root: Path) -> None:
    put_secret(root, "state-key-1", KEY)
    assert resolver(root).read_key("secret:file/state-key-1") == KEY
    assert resolver(root).read_key(SecretRef("file", "state-key-1")) == KEY


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_read_key_refuses_other_sizes(root: Path, size: int) -> None:
    put_secret(root, "state-key-1", b"k" * size)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/state-key-1")
    assert caught.value.code == Code.SECRET_MALFORMED
    assert caught.value.detail.startswith("secret:file/state-key-1: ")


def test_a_stricter_mode_is_accepted(root: Path) -> None:
    put_secret(root, "audit-key", KEY, mode=0o400)
    assert resolver(root).read_key("secret:file/audit-key") == KEY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o666])
def test_group_or_world_access_is_refused(root: Path, mode: int) -> None:
    put_secret(root, "audit-key", KEY, mode=mode)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_INSECURE
    assert caught.value.reference == SecretRef("file", "audit-key")
    assert f"{mode:04o}" in caught.value.detail


def test_a_file_owned_by_someone_else_is_refused(root: Path) -> None:
    put_secret(root, "audit-key", KEY)
    other_user = os.geteuid() + 1
    with pytest.raises(SecretError) as caught:
        resolver(root, expected_uid=other_user).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_INSECURE
    assert "owned" in caught.value.detail


def test_a_symlink_is_refused_even_to_a_good_file(root: Path, tmp_path: Path) -> None:
    target = put_secret(tmp_path, "real-key", KEY)
    (root / "audit-key").symlink_to(target)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert "symbolic link" in caught.value.detail


def test_a_symlinked_root_folder_is_followed(root: Path, tmp_path: Path) -> None:
    put_secret(root, "audit-key", KEY)
    link = tmp_path / "linked-root"
    link.symlink_to(root)
    assert resolver(link).read_key("secret:file/audit-key") == KEY


def test_a_missing_file_is_unreadable(root: Path) -> None:
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/absent")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert caught.value.detail == "secret:file/absent: does not exist"


def test_a_missing_root_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(SecretError) as caught:
        resolver(tmp_path / "nowhere").read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert "secret root" in caught.value.detail


def test_a_folder_is_not_a_secret(root: Path) -> None:
    (root / "audit-key").mkdir(mode=0o700)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert "regular file" in caught.value.detail


def test_a_fifo_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "audit-key", 0o600)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert "regular file" in caught.value.detail


def test_no_file_provider_means_file_references_are_unreadable() -> None:
    with pytest.raises(SecretError) as caught:
        resolver(None).read_key("secret:file/audit-key")
    assert caught.value.code == Code.SECRET_UNREADABLE
    assert "secretProviders.file" in caught.value.detail


def test_properties_are_judged_on_the_open_descriptor_not_the_path(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A path-based stat would let a file be swapped between the check and the read.
    put_secret(root, "audit-key", KEY)

    def no_path_stat(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a secret was judged by path")

    monkeypatch.setattr(os, "stat", no_path_stat)
    monkeypatch.setattr(os, "lstat", no_path_stat)
    assert resolver(root).read_key("secret:file/audit-key") == KEY


def test_errors_never_carry_the_content(root: Path) -> None:
    secret = CONTENT_MARKER.encode()
    put_secret(root, "long-key", secret)
    put_secret(root, "open-key", secret, mode=0o644)
    put_secret(root, "bad-jwk", secret)
    put_secret(root, "bad-text", secret + b"\xff")
    reader = resolver(root)
    messages = []
    for attempt in (
        lambda: reader.read_key("secret:file/long-key"),
        lambda: reader.read_key("secret:file/open-key"),
        lambda: reader.read_jwk("secret:file/bad-jwk"),
        lambda: reader.read_text("secret:file/bad-text"),
        lambda: reader.read_bytes("secret:file/long-key", min_len=64),
    ):
        with pytest.raises(SecretError) as caught:
            attempt()
        messages.append(str(caught.value))
    assert len(messages) == 5
    assert all(CONTENT_MARKER not in message for message in messages)


# -- text and bytes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"postgresql://u@h/db?sslmode=require\n", "postgresql://u@h/db?sslmode=require"),
        (b"token", "token"),
        (b"token\r\n", "token"),
        (b"token\n\n", "token\n"),
        (b"  spaced token  \n", "  spaced token  "),
        ("grüße\n".encode(), "grüße"),
    ],
)
def test_read_text_strips_one_trailing_newline(root: Path, data: bytes, expected: str) -> None:
    put_secret(root, "text", data)
    assert resolver(root).read_text("secret:file/text") == expected


@pytest.mark.parametrize("data", [b"", b"\n", b"\xff\xfe"])
def test_read_text_refuses_empty_or_binary(root: Path, data: bytes) -> None:
    put_secret(root, "text", data)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_text("secret:file/text")
    assert caught.value.code == Code.SECRET_MALFORMED


def test_read_text_limits_the_size(root: Path) -> None:
    put_secret(root, "token", b"t" * 4096 + b"\n")
    assert len(resolver(root).read_text("secret:file/token", max_len=4097)) == 4096
    put_secret(root, "token-long", b"t" * 4097)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_text("secret:file/token-long", max_len=4096)
    assert caught.value.code == Code.SECRET_MALFORMED
    assert "4096" in caught.value.detail


def test_read_bytes_honours_min_len(root: Path) -> None:
    put_secret(root, "hmac", b"h" * 48)
    assert resolver(root).read_bytes("secret:file/hmac", min_len=32) == b"h" * 48
    put_secret(root, "hmac-short", b"h" * 31)
    with pytest.raises(SecretError) as caught:
        resolver(root).read_bytes("secret:file/hmac-short", min_len=32)
    assert caught.value.code == Code.SECRET_MALFORMED
    assert "32" in caught.value.detail


# -- private JWKs ------------------------------------------------------------------------


@pytest.mark.parametrize("make", [es256_jwk, rs256_jwk], ids=["ES256", "RS256"])
def test_read_jwk_accepts_private_keys(root: Path, make: Any) -> None:
    jwk = make()
    put_secret(root, "client.jwk", json.dumps(jwk).encode() + b"\n")
    loaded = resolver(root).read_jwk("secret:file/client.jwk")
    assert loaded == jwk


def _without(jwk: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: value for name, value in jwk.items() if name not in names}


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda jwk: _without(jwk, "kid"), "kid"),
        (lambda jwk: {**jwk, "kid": ""}, "kid"),
        (lambda jwk: _without(jwk, "alg"), "alg"),
        (lambda jwk: {**jwk, "alg": "HS256"}, "alg"),
        (lambda jwk: {**jwk, "alg": "none"}, "alg"),
        (lambda jwk: _without(jwk, "d"), "private"),
        (lambda jwk: {**jwk, "alg": "RS256"}, "kty"),
        (lambda jwk: {**jwk, "crv": "P-384"}, "P-256"),
        (lambda jwk: {**jwk, "d": "AAAA"}, "usable"),
        (lambda jwk: [jwk], "object"),
    ],
    ids=[
        "no-kid",
        "empty-kid",
        "no-alg",
        "hs256",
        "none",
        "public-only",
        "kty",
        "curve",
        "bad-d",
        "list",
    ],
)
def test_read_jwk_refuses_what_cannot_sign(root: Path, mutate: Any, reason: str) -> None:
    put_secret(root, "client.jwk", json.dumps(mutate(es256_jwk())).encode())
    with pytest.raises(SecretError) as caught:
        resolver(root).read_jwk("secret:file/client.jwk")
    assert caught.value.code == Code.SECRET_MALFORMED
    assert reason in caught.value.detail


def test_read_jwk_refuses_non_json(root: Path) -> None:
    put_secret(root, "client.jwk", b"{not json")
    with pytest.raises(SecretError, match="not a JSON document"):
        resolver(root).read_jwk("secret:file/client.jwk")


# -- environment provider ----------------------------------------------------------------


def test_environment_values_are_text_and_base64_for_binary() -> None:
    environ = {
        "DB_URL": "postgresql://u@h/db?sslmode=require\n",
        "STATE_KEY": base64.b64encode(KEY).decode(),
        "HMAC": base64.b64encode(b"h" * 40).decode(),
    }
    reader = resolver(None, environment=True, environ=environ)
    assert reader.read_text("secret:env/DB_URL") == "postgresql://u@h/db?sslmode=require"
    assert reader.read_key("secret:env/STATE_KEY") == KEY
    assert reader.read_bytes("secret:env/HMAC", min_len=32) == b"h" * 40


def test_environment_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDINATOR_TEST_TOKEN", "abc")
    assert resolver(None, environment=True).read_text("secret:env/COORDINATOR_TEST_TOKEN") == "abc"


def test_environment_refusals() -> None:
    environ = {"NOT_B64": "%%%", "SHORT_KEY": base64.b64encode(b"k" * 16).decode()}
    disabled = resolver(None, environment=False, environ=environ)
    enabled = resolver(None, environment=True, environ=environ)
    cases: list[tuple[Callable[[], object], str, str]] = [
        (lambda: disabled.read_text("secret:env/NOT_B64"), Code.SECRET_UNREADABLE, "environment"),
        (lambda: enabled.read_text("secret:env/UNSET"), Code.SECRET_UNREADABLE, "not set"),
        (lambda: enabled.read_key("secret:env/NOT_B64"), Code.SECRET_MALFORMED, "base64"),
        (lambda: enabled.read_key("secret:env/SHORT_KEY"), Code.SECRET_MALFORMED, "32"),
    ]
    for attempt, code, reason in cases:
        with pytest.raises(SecretError) as caught:
            attempt()
        assert caught.value.code == code
        assert reason in caught.value.detail
        assert "%%%" not in caught.value.detail


# -- built from a runtime file -----------------------------------------------------------


def test_resolver_from_a_runtime_files_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", complete_runtime(tmp_path)))
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    put_secret(secrets, "admission-key", KEY)
    monkeypatch.setenv(
        "COORDINATOR_MIGRATION_URL", "postgresql://migrator@db/coord?sslmode=require"
    )
    reader = resolver_for(config)
    assert reader.read_key(config.deployment.admission_key_ref) == KEY
    assert reader.read_text(config.database.migration_url_ref).startswith("postgresql://migrator@")
