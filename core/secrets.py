"""Secret references and the typed readers that resolve them (CONTRACT §5, §7).

A runtime file never holds a secret value, only a reference:

- ``secret:file/<name>`` — a file directly under ``secretProviders.file.root``. The file is
  opened relative to the root's descriptor with ``O_NOFOLLOW`` and every property (regular
  file, owner, mode, size) is judged from ``fstat`` of that same descriptor, so a file
  swapped between the check and the read cannot slip through.
- ``secret:env/<NAME>`` — an environment variable, only when ``secretProviders.environment``
  is configured. Environment values are text; binary secrets given that way are base64.

Refusals carry the reference (``secret:file/audit-key``), never the content, and never the
value of an environment variable.

Codes introduced here (to be listed in the code catalogue):

- ``secret.unreadable``: the secret cannot be read — missing file, symlink, not a regular
  file, permission denied, unset variable, provider not configured.
- ``secret.insecure``: the file is readable or writable by group or others, or is not owned
  by the user the process runs as.
- ``secret.malformed``: the content has the wrong shape — wrong key length, not UTF-8, too
  long, not a private JWK.

A syntactically bad reference is ``config.invalid`` (:class:`core.errors.ConfigInvalid`).
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from core.codes import Code
from core.errors import ConfigInvalid, CoordinatorError

KEY_LENGTH = 32
"""Bytes in each of the state, admission and audit keys."""

DEFAULT_MAX_BYTES = 64 * 1024
"""Upper bound for any secret read; nothing the coordinator reads is anywhere near it."""

JWK_ALGORITHMS = ("RS256", "ES256")
"""Algorithms a connection's private JWK may declare."""

_FILE_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PREFIX = "secret:"

Provider = Literal["file", "env"]


@dataclass(frozen=True)
class SecretRef:
    """A parsed secret reference; ``str(ref)`` is the reference as written."""

    provider: Provider
    """``file`` or ``env``."""
    name: str
    """The file name under the file root, or the environment variable name."""

    def __str__(self) -> str:
        return f"{_PREFIX}{self.provider}/{self.name}"


class SecretError(CoordinatorError):
    """A secret could not be used; ``reference`` names it, the detail never shows content."""

    def __init__(self, code: Code, reference: SecretRef, reason: str) -> None:
        super().__init__(code, f"{reference}: {reason}")
        self.reference = reference
        self.reason = reason


def parse_reference(text: object, path: str = "") -> SecretRef:
    """Parse ``secret:file/<name>`` or ``secret:env/<NAME>``; refuse with ``config.invalid``.

    ``path`` is the key path the reference was found at, for the refusal.
    """
    if not isinstance(text, str):
        raise ConfigInvalid(path, "must be a secret reference string")
    if not text.startswith(_PREFIX) or "/" not in text:
        raise ConfigInvalid(path, "must be secret:file/<name> or secret:env/<NAME>")
    provider, _, name = text[len(_PREFIX) :].partition("/")
    if provider == "file":
        if name in (".", "..") or not _FILE_NAME.fullmatch(name):
            raise ConfigInvalid(
                path, "a file secret name is 1-128 characters of A-Z a-z 0-9 . _ - (not . or ..)"
            )
        return SecretRef("file", name)
    if provider == "env":
        if not _ENV_NAME.fullmatch(name):
            raise ConfigInvalid(
                path, "an environment secret name is a letter or _ then up to 127 of A-Z a-z 0-9 _"
            )
        return SecretRef("env", name)
    raise ConfigInvalid(path, "unknown secret provider (use secret:file/ or secret:env/)")


class SecretResolver:
    """Reads secrets for the providers a runtime file enables.

    ``expected_uid`` is the owner every secret file must have (the effective user by
    default); ``environ`` replaces ``os.environ`` for the environment provider.
    """

    def __init__(
        self,
        *,
        file_root: Path | None,
        environment: bool,
        environ: Mapping[str, str] | None = None,
        expected_uid: int | None = None,
    ) -> None:
        self._file_root = file_root
        self._environment = environment
        self._environ = environ
        self._expected_uid = os.geteuid() if expected_uid is None else expected_uid

    # -- typed readers -------------------------------------------------------------------

    def read_bytes(
        self, ref: SecretRef | str, *, min_len: int = 1, max_len: int = DEFAULT_MAX_BYTES
    ) -> bytes:
        """Raw bytes, between ``min_len`` and ``max_len`` long (base64 text for env)."""
        reference = _as_ref(ref)
        if reference.provider == "env":
            data = _decode_base64(reference, self._env_value(reference))
        else:
            data = self._read_file(reference, max_len)
        if len(data) < min_len:
            raise SecretError(Code.SECRET_MALFORMED, reference, f"shorter than {min_len} bytes")
        if len(data) > max_len:
            raise SecretError(Code.SECRET_MALFORMED, reference, f"longer than {max_len} bytes")
        return data

    def read_key(self, ref: SecretRef | str) -> bytes:
        """A 32-byte key (state, admission or audit key)."""
        reference = _as_ref(ref)
        data = self.read_bytes(reference, min_len=0, max_len=DEFAULT_MAX_BYTES)
        if len(data) != KEY_LENGTH:
            raise SecretError(
                Code.SECRET_MALFORMED, reference, f"a key must be exactly {KEY_LENGTH} bytes"
            )
        return data

    def read_text(self, ref: SecretRef | str, *, max_len: int = DEFAULT_MAX_BYTES) -> str:
        """UTF-8 text with one trailing newline removed; at most ``max_len`` bytes."""
        reference = _as_ref(ref)
        if reference.provider == "env":
            text = self._env_value(reference)
            data = text.encode("utf-8")
        else:
            data = self._read_file(reference, max_len)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise SecretError(Code.SECRET_MALFORMED, reference, "not UTF-8 text") from None
        if len(data) > max_len:
            raise SecretError(Code.SECRET_MALFORMED, reference, f"longer than {max_len} bytes")
        if text.endswith("\r\n"):
            text = text[:-2]
        elif text.endswith("\n"):
            text = text[:-1]
        if not text:
            raise SecretError(Code.SECRET_MALFORMED, reference, "empty")
        return text

    def read_jwk(self, ref: SecretRef | str) -> dict[str, Any]:
        """A private JWK (JSON object) with ``kid`` and ``alg`` RS256 or ES256."""
        reference = _as_ref(ref)
        text = self.read_text(reference)
        try:
            jwk = json.loads(text)
        except ValueError:
            raise SecretError(Code.SECRET_MALFORMED, reference, "not a JSON document") from None
        _check_private_jwk(reference, jwk)
        return dict(jwk)

    # -- providers -----------------------------------------------------------------------

    def _env_value(self, reference: SecretRef) -> str:
        if not self._environment:
            raise SecretError(
                Code.SECRET_UNREADABLE, reference, "secretProviders.environment is not configured"
            )
        environ = os.environ if self._environ is None else self._environ
        value = environ.get(reference.name)
        if value is None:
            raise SecretError(Code.SECRET_UNREADABLE, reference, "environment variable is not set")
        return value

    def _read_file(self, reference: SecretRef, max_len: int) -> bytes:
        if self._file_root is None:
            raise SecretError(
                Code.SECRET_UNREADABLE, reference, "secretProviders.file is not configured"
            )
        try:
            root_fd = os.open(self._file_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SecretError(
                Code.SECRET_UNREADABLE, reference, f"secret root cannot be opened ({_why(exc)})"
            ) from None
        try:
            # O_NONBLOCK keeps a FIFO planted under the root from blocking the open; the
            # fstat below refuses anything but a regular file anyway.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(reference.name, flags, dir_fd=root_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SecretError(
                        Code.SECRET_UNREADABLE, reference, "is a symbolic link"
                    ) from None
                raise SecretError(Code.SECRET_UNREADABLE, reference, _why(exc)) from None
        finally:
            os.close(root_fd)
        try:
            info = os.fstat(fd)
            self._check_file(reference, info)
            return _read_fd(reference, fd, max_len)
        finally:
            os.close(fd)

    def _check_file(self, reference: SecretRef, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(Code.SECRET_UNREADABLE, reference, "is not a regular file")
        if info.st_uid != self._expected_uid:
            raise SecretError(
                Code.SECRET_INSECURE, reference, "is not owned by the user the coordinator runs as"
            )
        if info.st_mode & 0o077:
            raise SecretError(
                Code.SECRET_INSECURE,
                reference,
                f"mode {stat.S_IMODE(info.st_mode):04o} grants group or others access; "
                "use 0600 or stricter",
            )


def _as_ref(ref: SecretRef | str) -> SecretRef:
    return ref if isinstance(ref, SecretRef) else parse_reference(ref)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    return errno.errorcode.get(exc.errno or 0, "cannot be opened")


def _read_fd(reference: SecretRef, fd: int, max_len: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        # Read one byte past the limit so an oversized file is refused, not truncated.
        chunk = os.read(fd, max_len + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_len:
            raise SecretError(Code.SECRET_MALFORMED, reference, f"longer than {max_len} bytes")
    return b"".join(chunks)


def _decode_base64(reference: SecretRef, value: str) -> bytes:
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(
            Code.SECRET_MALFORMED, reference, "a binary secret in the environment must be base64"
        ) from None


def _check_private_jwk(reference: SecretRef, jwk: object) -> None:
    def refuse(reason: str) -> SecretError:
        return SecretError(Code.SECRET_MALFORMED, reference, reason)

    if not isinstance(jwk, dict):
        raise refuse("a JWK must be a JSON object")
    kid = jwk.get("kid")
    if not isinstance(kid, str) or not kid:
        raise refuse("the JWK has no kid")
    alg = jwk.get("alg")
    if alg not in JWK_ALGORITHMS:
        raise refuse("the JWK alg must be RS256 or ES256")
    if "d" not in jwk:
        raise refuse("the JWK is not a private key")
    expected_kty = "RSA" if alg == "RS256" else "EC"
    if jwk.get("kty") != expected_kty:
        raise refuse(f"a JWK with alg {alg} must have kty {expected_kty}")
    if alg == "ES256" and jwk.get("crv") != "P-256":
        raise refuse("an ES256 JWK must use curve P-256")
    try:
        if alg == "RS256":
            RSAAlgorithm.from_jwk(jwk)
        else:
            ECAlgorithm.from_jwk(jwk)
    except Exception:  # any parser complaint means the same thing to us
        raise refuse("the JWK does not hold a usable private key") from None
