"""Admission key derivations: known answers, determinism, domain separation, encodings."""

from __future__ import annotations

import hashlib
import hmac
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.derive import (
    api_start_identity,
    command_key,
    encode_fields,
    event_start_identity,
    is_run_id,
    is_run_id_prefix,
    run_id,
    run_id_range,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
ISS = "https://issuer.example.org"
SUB = "portal-user-7"


def reference_encoding(*fields: str) -> bytes:
    """The documented layout, built independently: 4-byte big-endian length + UTF-8."""
    out = b""
    for text in fields:
        data = text.encode("utf-8")
        out += len(data).to_bytes(4, "big") + data
    return out


def reference_mac(*fields: str) -> bytes:
    return hmac.new(KEY, reference_encoding(*fields), hashlib.sha256).digest()


def test_api_start_identity_known_answer() -> None:
    expected = reference_mac(
        "registry-coordinator start-identity v1",
        "api",
        ISS,
        SUB,
        "approval-notice",
        "key-1",
    ).hex()
    assert api_start_identity(KEY, ISS, SUB, "approval-notice", "key-1") == expected


def test_event_start_identity_known_answer() -> None:
    expected = reference_mac(
        "registry-coordinator start-identity v1", "event", "urn:example:intake", "evt-42"
    ).hex()
    assert event_start_identity(KEY, "urn:example:intake", "evt-42") == expected


def test_run_id_known_answer() -> None:
    identity = api_start_identity(KEY, ISS, SUB, "approval-notice", "key-1")
    raw = bytearray(reference_mac("registry-coordinator run-id v1", identity)[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80
    raw[8] = (raw[8] & 0x3F) | 0x80
    expected = str(uuid.UUID(bytes=bytes(raw)))
    derived = run_id(KEY, identity)
    assert derived == expected
    parsed = uuid.UUID(derived)
    assert parsed.variant == uuid.RFC_4122
    assert (parsed.int >> 76) & 0xF == 8  # the version nibble
    assert is_run_id(derived)


def test_command_key_known_answer() -> None:
    run = "0b7e4a34-5c1d-8e2f-9a3b-4c5d6e7f8091"
    expected = reference_mac("registry-coordinator command-key v1", run, "send-approval").hex()
    assert command_key(KEY, run, "send-approval") == expected


def test_derivations_are_deterministic_and_keyed() -> None:
    identity = api_start_identity(KEY, ISS, SUB, "wf", "k")
    assert identity == api_start_identity(KEY, ISS, SUB, "wf", "k")
    assert identity != api_start_identity(OTHER_KEY, ISS, SUB, "wf", "k")
    assert run_id(KEY, identity) == run_id(KEY, identity)
    assert run_id(KEY, identity) != run_id(OTHER_KEY, identity)
    assert command_key(KEY, "r", "s") == command_key(KEY, "r", "s")
    assert command_key(KEY, "r", "s") != command_key(OTHER_KEY, "r", "s")


def test_every_field_of_the_api_identity_matters() -> None:
    base = ("iss", "sub", "wf", "key")
    seen = {api_start_identity(KEY, *base)}
    for position in range(4):
        changed = list(base)
        changed[position] += "x"
        seen.add(api_start_identity(KEY, *changed))
    assert len(seen) == 5


def test_field_boundaries_cannot_be_shifted() -> None:
    assert encode_fields("a", "bc") != encode_fields("ab", "c")
    assert api_start_identity(KEY, "a", "bc", "wf", "k") != api_start_identity(
        KEY, "ab", "c", "wf", "k"
    )
    assert api_start_identity(KEY, "i", "s", "w\n", "k") != api_start_identity(
        KEY, "i", "s", "w", "\nk"
    )
    assert event_start_identity(KEY, "a", "bc") != event_start_identity(KEY, "ab", "c")
    assert command_key(KEY, "run-a", "bc") != command_key(KEY, "run-ab", "c")


def test_api_and_event_identities_are_separate_domains() -> None:
    # An event whose (source, id) spells the same text as an API start's fields still
    # derives another identity, because the kind is part of the message.
    api = api_start_identity(KEY, "src", "evt", "", "")
    event = event_start_identity(KEY, "src", "evt")
    assert api != event


def test_labels_separate_the_three_derivations() -> None:
    # The same fields under another derivation's label give another value: the label is
    # part of every message.
    assert (
        command_key(KEY, "r", "s")
        == reference_mac("registry-coordinator command-key v1", "r", "s").hex()
    )
    for label in ("registry-coordinator start-identity v1", "registry-coordinator run-id v1"):
        assert command_key(KEY, "r", "s") != reference_mac(label, "r", "s").hex()


def test_run_id_requires_a_start_identity() -> None:
    with pytest.raises(ValueError, match="start identity"):
        run_id(KEY, "not-an-identity")


def test_wrong_key_length_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        command_key(b"short", "r", "s")


@pytest.mark.parametrize(
    "text",
    [
        "0b7e4a34-5c1d-4e2f-9a3b-4c5d6e7f8091",  # version 4
        "0B7E4A34-5C1D-8E2F-9A3B-4C5D6E7F8091",  # upper case
        "0b7e4a345c1d8e2f9a3b4c5d6e7f8091",  # no hyphens
        "0b7e4a34-5c1d-8e2f-7a3b-4c5d6e7f8091",  # wrong variant
        "../etc/passwd",
    ],
)
def test_is_run_id_refuses_other_forms(text: str) -> None:
    assert not is_run_id(text)


@given(
    left=st.lists(st.text(max_size=6), min_size=2, max_size=4),
    right=st.lists(st.text(max_size=6), min_size=2, max_size=4),
)
def test_encoding_is_injective(left: list[str], right: list[str]) -> None:
    if left != right:
        assert encode_fields(*left) != encode_fields(*right)
    else:
        assert encode_fields(*left) == encode_fields(*right)


@given(text=st.text(min_size=1, max_size=20))
def test_run_ids_are_canonical_uuid_text(text: str) -> None:
    derived = run_id(KEY, event_start_identity(KEY, "source", text))
    assert is_run_id(derived)
    assert str(uuid.UUID(derived)) == derived


RUN_IDS = sorted(run_id(KEY, event_start_identity(KEY, "source", str(n))) for n in range(2000))


@given(which=st.integers(0, len(RUN_IDS) - 1), length=st.integers(4, 36))
def test_a_prefix_range_holds_exactly_the_ids_that_start_with_it(which: int, length: int) -> None:
    prefix = RUN_IDS[which][:length]
    assert is_run_id_prefix(prefix)
    low, below = run_id_range(prefix)
    in_range = [i for i in RUN_IDS if low <= i < below]
    assert in_range == [i for i in RUN_IDS if i.startswith(prefix)]
    # No bound ends in a character that language collations skip (a hyphen) or place
    # elsewhere (a colon, the byte after 9).
    assert low[-1] in "0123456789abcdef" and below[-1] in "0123456789abcdefg"


@pytest.mark.parametrize(
    "text", ["abc", "ABCD", "abcg", "abcd-", "abcd1234e", "abcd1234-ef0-", "x" * 37, ""]
)
def test_a_run_id_prefix_is_the_start_of_a_run_ids_form(text: str) -> None:
    assert not is_run_id_prefix(text)
