"""What every answer to a fuzzed request must be (issue 27, item 3), as one function.

:func:`answer_faults` judges one answer against the request that produced it and what the
deployment was going through meanwhile (:class:`Conditions`), and lists what is wrong with
it, in words that name no value:

- a 5xx other than 503;
- a 503 that is not ``service.unavailable``, or that came while no dependency was down
  and the listener was under ``maxConnections`` (the over-limit refusal is
  ``service.unavailable`` too): the fuzz session says which dependencies it took down and
  whether the gateway's over-limit count rose. ``GET /ready``'s not-ready document is held
  to the second half;
- an error (4xx or 5xx) that is not an RFC 9457 problem: not ``application/problem+json``,
  not a JSON object with ``type``, ``title``, ``status``, ``detail`` and ``code``, a
  ``status`` other than the answer's, or a ``code`` that ``core/codes.py`` does not give
  that status (with the ``type`` and ``title`` the catalogue gives it); a 401 without
  ``WWW-Authenticate``, a 405 without ``Allow``. ``GET /ready`` is the one documented
  exception: its 503 is the JSON ``{"ready": false, "reasons": [...]}``. A ``HEAD`` answer
  has no body, so only its media type is judged;
- an answer (headers or body) holding a credential the fuzzer holds — any token, key or
  signature, in the forms :func:`credential_forms` lists — or a value the request carried.

Which sent values count: every string of the path, query, headers and body values (a
body's member names are names, not values: a 422 names the place it refuses with a JSON
pointer, CONTRACT §8, and a stray member's pointer spells its name) of at least
:data:`MIN_ECHO_CHARS` characters, less the strings the OpenAPI
document itself spells (enum members, constants, examples: a service may well answer
them) and the values the caller was handed by the service before (run ids, workflow ids,
the event source): an answer naming the run it is about echoes nothing. The problem's
``instance`` member is the request's path by design (RFC 9457, ``docs/openapi.yaml``), so
it is judged only for being exactly that; every other member is searched.

Where a sent value turns up matters too: inside our own words it echoes nothing. A request
may well spell part of a sentence the service says to everyone ("is missing", sent as a
workflow id, is part of "the access token is missing or not acceptable"). An occurrence of
a sent value counts only where it is not wholly inside an occurrence, in the same answer,
of fixed text of the service: the code catalogue's titles, codes and problem types, and
every string constant of the service's source (:func:`own_words`). So a value that merely
is our words never counts, and one that holds them and more still does.
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from core.codes import Code

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
MIN_ECHO_CHARS: Final = 8
"""Shorter strings turn up in any answer by chance ("running", "00000000" in an id)."""
MIN_CREDENTIAL_CHARS: Final = 8

PROBLEM_MEMBERS: Final = ("type", "title", "status", "detail", "code")
CATALOGUE: Final[Mapping[str, Code]] = {
    code.value: code for code in Code if code.status is not None
}
"""Every code the gateway may answer, by its spelling."""


@dataclass(frozen=True)
class Sent:
    """One request as the fuzzer sent it."""

    method: str
    path: str
    """The path as sent on the wire (percent-encoded)."""
    query: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    """The JSON value sent, or the raw bytes of a body that is no JSON."""


@dataclass(frozen=True)
class Answer:
    """One answer as the client saw it."""

    status: int
    headers: Mapping[str, str]
    """Header names in lower case."""
    body: bytes


@dataclass(frozen=True)
class Secrets:
    """What an answer must never hold, beyond the request's own values."""

    credentials: Collection[str] = ()
    """Every token, key (as text) and signature the fuzzer holds or sent."""
    known: Collection[str] = ()
    """Values the service handed out or the deployment names (run ids, workflow ids, the
    event source): an answer may carry them back."""
    document_strings: Collection[str] = ()
    """Every string the OpenAPI document spells."""
    public_url: str = ""
    """Prefix of the problem ``instance`` member (``deployment.listener.publicUrl``)."""


@dataclass(frozen=True)
class Conditions:
    """What the deployment was going through while one request was out: the only
    circumstances that make a 503 an honest answer."""

    down: Collection[str] = ()
    """The dependencies the fuzz session had taken down (names, for the record)."""
    over_limit: bool = False
    """A listener refused requests for being at ``maxConnections`` meanwhile: the gateway's
    ``coordinator_http_requests_total{route="over-limit"}`` rose."""

    @property
    def unavailable(self) -> bool:
        """Whether a 503 ``service.unavailable`` can be the truth."""
        return bool(self.down) or self.over_limit


NOTHING_DOWN: Final = Conditions()
UNAVAILABLE: Final = Code.SERVICE_UNAVAILABLE
"""The one code a 503 may carry: a dependency is down, or the listener is at its limit
(``gateway/service.py`` refuses with it too)."""


def answer_faults(
    sent: Sent, answer: Answer, secrets: Secrets, conditions: Conditions = NOTHING_DOWN
) -> list[str]:
    """What is wrong with ``answer`` to ``sent``, given ``conditions``; empty when nothing is."""
    faults: list[str] = []
    if answer.status >= 500 and answer.status != 503:
        faults.append(f"answered {answer.status}")
    document = _json(answer.body)
    if answer.status == 503:
        faults += _unavailable_faults(document, conditions)
    if answer.status >= 400:
        faults += _error_faults(sent, answer, document)
    faults += _echo_faults(sent, answer, document, secrets)
    return faults


def _unavailable_faults(document: Any, conditions: Conditions) -> list[str]:
    faults: list[str] = []
    spelled = document.get("code") if isinstance(document, dict) else None
    code = CATALOGUE.get(spelled) if isinstance(spelled, str) else None
    # A code outside the catalogue, or none, is _error_faults' finding (and /ready's
    # document has none by design).
    if code is not None and code is not UNAVAILABLE:
        faults.append(f"503 {code.value}, not {UNAVAILABLE.value}")
    if not conditions.unavailable:
        faults.append("503 while no dependency was down and the listener was under its limit")
    return faults


# ---------------------------------------------------------------------------- refusals


def _error_faults(sent: Sent, answer: Answer, document: Any) -> list[str]:
    media_type = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    head = sent.method.upper() == "HEAD"
    if sent.path == "/ready" and answer.status == 503 and sent.method.upper() in ("GET", "HEAD"):
        if media_type != "application/json":
            return [f"/ready 503 as {media_type or 'no media type'}"]
        if head:
            return []
        if not isinstance(document, dict) or document.get("ready") is not False:
            return ["/ready 503 is not the not-ready document"]
        return []
    faults: list[str] = []
    if media_type != PROBLEM_MEDIA_TYPE:
        faults.append(f"error {answer.status} as {media_type or 'no media type'}")
    if answer.status == 401 and "www-authenticate" not in answer.headers:
        faults.append("401 without WWW-Authenticate")
    if answer.status == 405 and "allow" not in answer.headers:
        faults.append("405 without Allow")
    if head:
        if answer.body:
            faults.append("HEAD answer with a body")
        return faults
    if not isinstance(document, dict):
        return [*faults, f"error {answer.status} whose body is no JSON object"]
    missing = [name for name in PROBLEM_MEMBERS if name not in document]
    if missing:
        faults.append(f"problem without {', '.join(missing)}")
    if document.get("status") != answer.status:
        faults.append(f"problem status member is not {answer.status}")
    spelled = document.get("code")
    code = CATALOGUE.get(spelled) if isinstance(spelled, str) else None
    if code is None:
        faults.append(f"problem code not in the catalogue ({answer.status})")
    elif code.status != answer.status:
        faults.append(f"problem code {code.value} answered with {answer.status}")
    elif document.get("type") != code.type_uri or document.get("title") != code.info.title:
        faults.append(f"problem {code.value} with another type or title")
    return faults


# ------------------------------------------------------------------------------ echoes


def credential_forms(credential: str) -> Iterator[str]:
    """The ways an answer could carry ``credential``: as is, a JWT's signature alone, and
    base64 of it."""
    if len(credential) < MIN_CREDENTIAL_CHARS:
        return
    yield credential
    parts = credential.split(".")
    if len(parts) == 3 and len(parts[2]) >= MIN_CREDENTIAL_CHARS:
        yield parts[2]
    raw = credential.encode("utf-8", "surrogatepass")
    yield base64.b64encode(raw).decode().rstrip("=")
    yield base64.urlsafe_b64encode(raw).decode().rstrip("=")


def sent_strings(sent: Sent) -> Iterator[str]:
    """Every string the request carried, as the service read it."""
    for segment in sent.path.split("/"):
        yield unquote(segment, errors="replace")
    for name, value in sent.query.items():
        yield str(name)
        values = value if isinstance(value, list | tuple) else [value]
        yield from (str(item) for item in values)
    for name, value in sent.headers.items():
        if name.lower() != "authorization":
            yield value
    yield from _strings(sent.body, names=False)


def _strings(value: Any, *, names: bool = True) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if names:
                yield str(key)
            yield from _strings(item, names=names)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item, names=names)


def echo_candidates(sent: Sent, secrets: Secrets) -> set[str]:
    """The sent strings an answer must not hold."""
    skipped = set(secrets.known) | set(secrets.document_strings)
    return {
        text
        for text in sent_strings(sent)
        if len(text.strip()) >= MIN_ECHO_CHARS and text not in skipped
    }


SERVICE_PACKAGES: Final = ("core", "gateway", "admission", "dispatcher", "recovery", "auditd")
"""The packages whose processes answer the API (``coordinatorctl`` answers nobody)."""
ROOT: Final = Path(__file__).resolve().parents[2]
_PLACEHOLDER: Final = re.compile(r"%(?:\(\w+\))?[-#0 +]*\d*(?:\.\d+)?[sdifrxg]|\{[^{}]*\}")
"""A ``%``- or ``str.format`` placeholder: what a template says is around it, not it."""


@functools.cache
def own_words() -> frozenset[str]:
    """The service's fixed text of :data:`MIN_ECHO_CHARS` characters or more: every code's
    spelling, problem type and title, and every string (or bytes) constant of the service's
    source that is an expression's value — the pieces of its messages, templates split at
    their placeholders, header values — but not a docstring, which no answer says."""
    found: set[str] = set()
    for code in Code:
        found.update((code.value, code.info.title, code.type_uri))
    for package in SERVICE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.update(_constants(ast.parse(path.read_text(encoding="utf-8"))))
    return frozenset(
        piece
        for text in found
        for piece in _PLACEHOLDER.split(text)
        if len(piece) >= MIN_ECHO_CHARS
    )


def _constants(tree: ast.AST) -> Iterator[str]:
    said = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in said:
            if isinstance(node.value, str):
                yield node.value
            elif isinstance(node.value, bytes):
                yield node.value.decode("latin-1")


def _echo_faults(sent: Sent, answer: Answer, document: Any, secrets: Secrets) -> list[str]:
    faults: list[str] = []
    if _held_credentials(answer, secrets):
        faults.append("answer holds a credential")
    if isinstance(document, dict) and answer.status >= 400 and "instance" in document:
        expected = secrets.public_url.rstrip("/") + sent.path
        if _normal_path(str(document["instance"])) != _normal_path(expected):
            faults.append("problem instance is not the request's path")
    echoed = echoes(sent, answer, secrets)
    if echoed:
        faults.append(f"answer holds a sent value ({len(echoed[0])} characters)")
    return faults


def _held_credentials(answer: Answer, secrets: Secrets) -> bool:
    texts = [*answer.headers.values(), answer.body.decode("utf-8", "replace")]
    return any(
        form in text
        for credential in secrets.credentials
        for form in credential_forms(credential)
        for text in texts
    )


def _normal_path(path: str) -> str:
    # The URL parser behind ``instance`` drops tabs and line breaks (as WHATWG URLs do) and
    # may leave some characters percent-encoded: compare what both spell.
    return "".join(ch for ch in unquote(path, errors="replace") if ch not in "\t\r\n")


def echoes(sent: Sent, answer: Answer, secrets: Secrets) -> list[str]:
    """The sent strings the answer holds (header values, every member of a JSON body but a
    problem's ``instance``, or the raw text of any other body) somewhere other than inside
    our own words (:func:`own_words`), longest first."""
    searched = list(answer.headers.values())
    document = _json(answer.body)
    if isinstance(document, dict) and answer.status >= 400:
        searched += list(_strings({k: v for k, v in document.items() if k != "instance"}))
    elif document is not None:
        searched += list(_strings(document))
    else:
        searched.append(answer.body.decode("utf-8", "replace"))
    found = [
        text
        for text in echo_candidates(sent, secrets)
        if any(_outside_own_words(text, place) for place in searched)
    ]
    return sorted(found, key=lambda text: (-len(text), text))


def _outside_own_words(text: str, place: str) -> bool:
    """Whether ``text`` occurs in ``place`` at least once not wholly inside an occurrence
    of one of our own words in ``place``."""
    if text not in place:
        return False
    # Only words that occur here can cover anything, and only those as long as ``text``.
    spans = [
        (start, start + len(word))
        for word in own_words()
        if len(word) >= len(text) and word in place
        for start in _occurrences(word, place)
    ]
    return any(
        not any(begin <= start and start + len(text) <= end for begin, end in spans)
        for start in _occurrences(text, place)
    )


def _occurrences(text: str, place: str) -> Iterator[int]:
    start = place.find(text)
    while start >= 0:
        yield start
        start = place.find(text, start + 1)


def _json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def document_strings(document: Any) -> set[str]:
    """Every string an OpenAPI document spells (values and member names)."""
    return set(_walk(document))


def _walk(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            if str(key).startswith("/"):
                # A path template's fixed segments ("review-completions") are the route's.
                yield from str(key).split("/")
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)
