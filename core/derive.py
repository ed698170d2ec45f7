"""Deterministic identities derived with the admission key (CONTRACT §7).

Three derivations, all HMAC-SHA-256 under the admission key:

- the **start identity** of a start request, from ``("api", iss, sub, workflow id, client
  idempotency key)`` or from ``("event", source, event id)``; 64 lowercase hex digits;
- the **run id**, from the start identity; a UUID string (RFC 9562 version 8, the
  vendor-defined layout) carrying 122 bits of the HMAC;
- the **command key** of a call step, from the run id and the step id; 64 lowercase hex
  digits, sent to products as ``Idempotency-Key``.

Because none of them depends on anything but the key and the inputs, a start admitted
again after a database restore gets the same run id and the same command keys, and the
products recognise what they already accepted.

A fourth, the **wait match** of a ``wait-for`` step (connection, result, review id), is how
admission finds the waiting step a Casework completion event concerns without decrypting
anything (:func:`wait_match`).

Every HMAC message starts with a label naming the derivation (domain separation: a start
identity can never equal a command key for other inputs) followed by the fields, each as a
4-byte big-endian length and its UTF-8 bytes, so ``("a", "bc")`` and ``("ab", "c")`` encode
differently.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
import uuid
from typing import Final

KEY_BYTES: Final = 32

START_IDENTITY_LABEL: Final = "registry-coordinator start-identity v1"
RUN_ID_LABEL: Final = "registry-coordinator run-id v1"
COMMAND_KEY_LABEL: Final = "registry-coordinator command-key v1"
WAIT_MATCH_LABEL: Final = "registry-coordinator wait-match v1"

RUN_ID_PATTERN: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
)
"""The canonical text of every run id this module derives."""

_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def encode_fields(*fields: str) -> bytes:
    """Length-prefixed encoding of text fields: for each, 4-byte big-endian length + UTF-8."""
    parts: list[bytes] = []
    for text in fields:
        data = text.encode("utf-8")
        parts.append(struct.pack(">I", len(data)))
        parts.append(data)
    return b"".join(parts)


def _mac(admission_key: bytes, label: str, *fields: str) -> bytes:
    if len(admission_key) != KEY_BYTES:
        raise ValueError(f"the admission key must be {KEY_BYTES} bytes")
    return hmac.new(admission_key, encode_fields(label, *fields), hashlib.sha256).digest()


def api_start_identity(
    admission_key: bytes, iss: str, sub: str, workflow_id: str, idempotency_key: str
) -> str:
    """Start identity of an API start by principal ``(iss, sub)``; 64 lowercase hex digits."""
    return _mac(
        admission_key, START_IDENTITY_LABEL, "api", iss, sub, workflow_id, idempotency_key
    ).hex()


def event_start_identity(admission_key: bytes, source: str, event_id: str) -> str:
    """Start identity of a signed event ``(source, id)``; 64 lowercase hex digits."""
    return _mac(admission_key, START_IDENTITY_LABEL, "event", source, event_id).hex()


def run_id(admission_key: bytes, start_identity: str) -> str:
    """The run id of a start identity: a lowercase UUID string, version 8, RFC variant.

    The first 16 bytes of the HMAC become the UUID, with the six version and variant bits
    overwritten; 122 bits remain from the HMAC.
    """
    if not _HEX64.fullmatch(start_identity):
        raise ValueError("a start identity is 64 lowercase hex digits")
    raw = bytearray(_mac(admission_key, RUN_ID_LABEL, start_identity)[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8: vendor-defined contents
    raw[8] = (raw[8] & 0x3F) | 0x80  # variant 10xx: the RFC layout
    return str(uuid.UUID(bytes=bytes(raw)))


def command_key(admission_key: bytes, run_id: str, step_id: str) -> str:
    """The command key of ``step_id`` in ``run_id``; the same for every attempt of the step."""
    return _mac(admission_key, COMMAND_KEY_LABEL, run_id, step_id).hex()


def wait_match(admission_key: bytes, connection: str, result: str, identity: str) -> bytes:
    """The keyed digest a waiting ``wait-for`` step is found by (32 bytes).

    ``identity`` is the awaited result's identifying value (Casework's review id) and
    ``connection`` the runtime file's connection name, so two Casework projects that happen
    to share a review id never wake each other's runs. Keyed, so the stored digest of a
    guessable review id reveals nothing to a reader of the database without the key.
    """
    return _mac(admission_key, WAIT_MATCH_LABEL, connection, result, identity)


def is_run_id(text: str) -> bool:
    """True when ``text`` has the exact form of a derived run id (for route parameters)."""
    return RUN_ID_PATTERN.fullmatch(text) is not None


RUN_ID_PREFIX_MIN: Final = 4
"""The shortest run id prefix a search takes (one run in 65,536 shares four hex digits)."""

_RUN_ID_SHAPE: Final = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


def is_run_id_prefix(text: str) -> bool:
    """True when ``text`` is the first 4 to 36 characters of a run id's form: lowercase hex
    digits, with the hyphens where a run id has them."""
    if not RUN_ID_PREFIX_MIN <= len(text) <= len(_RUN_ID_SHAPE):
        return False
    for char, shape in zip(text, _RUN_ID_SHAPE, strict=False):
        if (char == "-") != (shape == "-"):
            return False
        if char != "-" and char not in "0123456789abcdef":
            return False
    return True


def run_id_range(prefix: str) -> tuple[str, str]:
    """``(from, below)``: every run id that starts with ``prefix`` (one that
    :func:`is_run_id_prefix` accepts) sorts in ``[from, below)``, in byte order and in the
    usual language collations alike. A trailing hyphen is dropped, and the last hex digit is
    raised to the next one (``9`` to ``a``, ``f`` to ``g``), so no bound ends in punctuation,
    which language collations skip."""
    stem = prefix.rstrip("-")
    last = stem[-1]
    raised = "a" if last == "9" else chr(ord(last) + 1)
    return stem, stem[:-1] + raised
