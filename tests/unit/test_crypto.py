"""Payload sealing: round trips, binding of the associated data, custody and rotation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.codes import Code
from core.config import load_runtime_file
from core.crypto import (
    NONCE_BYTES,
    PURPOSES,
    Keyring,
    Sealed,
    associated_data,
    keyring_from_config,
    open_,
    seal,
)
from core.errors import CoordinatorError
from core.secrets import SecretResolver
from tests.helpers.runtime_files import complete_runtime, write_runtime

KEY_1 = bytes(range(32))
KEY_2 = bytes(range(100, 132))
NAMESPACE = "coordinator_test"
RUN = "6f1c2d3e-4a5b-8c6d-9e7f-0123456789ab"
SECRET_TEXT = b'{"applicantRef":"person-4711","note":"private"}'


@pytest.fixture
def keyring() -> Keyring:
    return Keyring(keys={1: KEY_1}, active=1)


def test_round_trip_for_every_purpose(keyring: Keyring) -> None:
    for purpose in PURPOSES:
        sealed = seal(keyring, NAMESPACE, RUN, purpose, SECRET_TEXT)
        assert sealed.key_version == 1
        assert len(sealed.nonce) == NONCE_BYTES
        assert SECRET_TEXT not in sealed.ciphertext
        assert open_(keyring, NAMESPACE, RUN, purpose, sealed) == SECRET_TEXT


def test_empty_payload_round_trips(keyring: Keyring) -> None:
    sealed = seal(keyring, NAMESPACE, RUN, "output", b"")
    assert open_(keyring, NAMESPACE, RUN, "output", sealed) == b""


def test_each_seal_uses_a_fresh_nonce(keyring: Keyring) -> None:
    seals = [seal(keyring, NAMESPACE, RUN, "input", SECRET_TEXT) for _ in range(50)]
    assert len({item.nonce for item in seals}) == 50
    assert len({item.ciphertext for item in seals}) == 50


def test_known_answer_against_an_independent_aes_gcm(keyring: Keyring) -> None:
    nonce = bytes(range(12))
    sealed = seal(keyring, NAMESPACE, RUN, "command", SECRET_TEXT, random_bytes=lambda n: nonce)
    # Rebuild the associated data from the documented layout, not from the module.
    expected_aad = b"registry-coordinator payload v1"
    for text in (NAMESPACE, RUN, "command"):
        expected_aad += struct.pack(">I", len(text)) + text.encode()
    expected_aad += struct.pack(">I", 1)
    assert associated_data(NAMESPACE, RUN, "command", 1) == expected_aad
    expected = AESGCM(KEY_1).encrypt(nonce, SECRET_TEXT, expected_aad)
    assert sealed == Sealed(key_version=1, nonce=nonce, ciphertext=expected)


def test_associated_data_is_unambiguous() -> None:
    assert associated_data("a", "bc", "input", 1) != associated_data("ab", "c", "input", 1)
    assert associated_data("ns", "run", "input", 1) != associated_data("ns", "run", "output", 1)
    assert associated_data("ns", "run", "input", 1) != associated_data("ns", "run", "input", 2)


@pytest.mark.parametrize(
    ("namespace", "run_id", "purpose"),
    [
        ("coordinator_other", RUN, "input"),
        (NAMESPACE, "6f1c2d3e-4a5b-8c6d-9e7f-0123456789ac", "input"),
        (NAMESPACE, RUN, "output"),
    ],
    ids=["namespace", "run", "purpose"],
)
def test_a_payload_opens_only_where_it_was_sealed(
    keyring: Keyring, namespace: str, run_id: str, purpose: str
) -> None:
    sealed = seal(keyring, NAMESPACE, RUN, "input", SECRET_TEXT)
    with pytest.raises(CoordinatorError) as caught:
        open_(keyring, namespace, run_id, purpose, sealed)
    assert caught.value.code == Code.STATE_PAYLOAD_UNAUTHENTIC
    assert SECRET_TEXT.decode() not in str(caught.value)


def test_relabelling_the_key_version_fails() -> None:
    # Both versions hold the same key bytes: only the associated data can tell them apart.
    keyring = Keyring(keys={1: KEY_1, 2: KEY_1}, active=1)
    sealed = seal(keyring, NAMESPACE, RUN, "input", SECRET_TEXT)
    relabelled = Sealed(key_version=2, nonce=sealed.nonce, ciphertext=sealed.ciphertext)
    with pytest.raises(CoordinatorError) as caught:
        open_(keyring, NAMESPACE, RUN, "input", relabelled)
    assert caught.value.code == Code.STATE_PAYLOAD_UNAUTHENTIC


@pytest.mark.parametrize("part", ["ciphertext", "tag", "nonce"])
def test_tampering_is_detected(keyring: Keyring, part: str) -> None:
    sealed = seal(keyring, NAMESPACE, RUN, "response", SECRET_TEXT)
    nonce, body = bytearray(sealed.nonce), bytearray(sealed.ciphertext)
    if part == "ciphertext":
        body[0] ^= 0x01
    elif part == "tag":
        body[-1] ^= 0x80
    else:
        nonce[5] ^= 0x10
    tampered = Sealed(sealed.key_version, bytes(nonce), bytes(body))
    with pytest.raises(CoordinatorError) as caught:
        open_(keyring, NAMESPACE, RUN, "response", tampered)
    assert caught.value.code == Code.STATE_PAYLOAD_UNAUTHENTIC
    assert "private" not in caught.value.detail


def test_malformed_sealed_values_are_refused(keyring: Keyring) -> None:
    sealed = seal(keyring, NAMESPACE, RUN, "event", SECRET_TEXT)
    for bad in (
        Sealed(1, sealed.nonce[:8], sealed.ciphertext),
        Sealed(1, sealed.nonce, sealed.ciphertext[:10]),
    ):
        with pytest.raises(CoordinatorError) as caught:
            open_(keyring, NAMESPACE, RUN, "event", bad)
        assert caught.value.code == Code.STATE_PAYLOAD_UNAUTHENTIC


def test_a_key_version_that_is_not_configured_is_a_custody_failure(keyring: Keyring) -> None:
    other = Keyring(keys={2: KEY_2}, active=2)
    sealed = seal(other, NAMESPACE, RUN, "wait-result", SECRET_TEXT)
    with pytest.raises(CoordinatorError) as caught:
        open_(keyring, NAMESPACE, RUN, "wait-result", sealed)
    assert caught.value.code == Code.STATE_KEY_CUSTODY
    assert "version 2" in caught.value.detail


def test_a_wrong_key_under_the_right_version_does_not_authenticate(keyring: Keyring) -> None:
    sealed = seal(keyring, NAMESPACE, RUN, "input", SECRET_TEXT)
    swapped = Keyring(keys={1: KEY_2}, active=1)
    with pytest.raises(CoordinatorError) as caught:
        open_(swapped, NAMESPACE, RUN, "input", sealed)
    assert caught.value.code == Code.STATE_PAYLOAD_UNAUTHENTIC


def test_rotation_writes_with_the_active_version_and_reads_older_ones(keyring: Keyring) -> None:
    old = seal(keyring, NAMESPACE, RUN, "input", SECRET_TEXT)
    rotated = Keyring(keys={1: KEY_1, 2: KEY_2}, active=2)
    new = seal(rotated, NAMESPACE, RUN, "input", b"newer")
    assert new.key_version == 2
    assert open_(rotated, NAMESPACE, RUN, "input", old) == SECRET_TEXT
    assert open_(rotated, NAMESPACE, RUN, "input", new) == b"newer"
    assert rotated.versions == (1, 2)


def test_unknown_purpose_is_a_programming_error(keyring: Keyring) -> None:
    with pytest.raises(ValueError, match="purpose"):
        seal(keyring, NAMESPACE, RUN, "secrets", SECRET_TEXT)


@pytest.mark.parametrize(
    ("keys", "active", "message"),
    [
        ({1: b"short"}, 1, "32 bytes"),
        ({1: KEY_1}, 2, "not configured"),
        ({0: KEY_1}, 0, "positive"),
    ],
)
def test_keyring_validation(keys: dict[int, bytes], active: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Keyring(keys=keys, active=active)


def test_keyring_never_shows_its_keys() -> None:
    keyring = Keyring(keys={1: KEY_1}, active=1)
    assert KEY_1.hex() not in repr(keyring)
    assert repr(KEY_1) not in repr(keyring)


def test_keyring_is_isolated_from_later_changes_of_the_source_dict() -> None:
    source = {1: KEY_1}
    keyring = Keyring(keys=source, active=1)
    source[1] = KEY_2
    assert keyring.keys[1] == KEY_1


def test_keyring_from_config_reads_every_version(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    for name, key in (("state-key-1", KEY_1), ("state-key-2", KEY_2)):
        path = secrets / name
        path.write_bytes(key)
        os.chmod(path, 0o600)
    keyring = keyring_from_config(config, SecretResolver(file_root=secrets, environment=False))
    assert keyring.active == 2
    assert dict(keyring.keys) == {1: KEY_1, 2: KEY_2}
