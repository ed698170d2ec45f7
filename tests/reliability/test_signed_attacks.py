"""Attacks on the producer routes of the running gateway: signed events and review
completions (issue 27, item 2).

The target is a deployed local stack of the approval-notice example (development issuer,
Casework and Messaging stand-ins, the all-in-one coordinator), its clock pinned to a file so
the 300 s window of CONTRACT §9.6 is tested to the second. Every attack is a request a
producer could send over HTTP:

- ``POST /v1/events`` (§9.6): no, an empty or a repeated ``registry-event-signature``; a bad
  HMAC (another key, one digit changed, cut short, over the body without ``t``); ``t``
  stale or in the future past the window, changed after signing, missing; a body altered
  after signing (data, id, source, one byte, re-encoded) or another event's signature; an
  unknown source; a signed body with ``data`` twice (no two readers may see two events in
  it); a replay of an accepted event once its window has passed;
- ``POST /v1/review-completions`` (§9.5): a missing, repeated or empty header; a wrong
  token (one character changed, cut, extended, another case, a caller's access token,
  another scheme); a wrong binding; token and binding swapped.

Each is answered as :func:`assert_refused` says: 401, an RFC 9457 problem with code
``authentication.refused``, and nothing of what was sent (nor the configured key or token) in
the body or the headers — and nothing behind the gateway was asked: the audit journal, where
every authenticated producer request is recorded before its answer, gains no record. The
controls (a valid event at now and at both edges of the window, a redelivery, a valid
completion) are accepted, and at the end the only runs in the database are theirs.

The comparisons are shown to be constant-time by behaviour, in-process: with
``hmac.compare_digest`` replaced by a recorder, every configured secret is compared through
it and its answer alone decides. Broken variants: a gateway whose freshness check is gone
accepts the events signed outside the window, and :func:`assert_refused` fails on them; a
completion match written with ``==`` fails :func:`check_compared_in_constant_time`.

Figures (attacks tried / refused per route) go to ``.cache/reliability/signed-attacks.json``
and the test output.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import json
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

import gateway.completions
import gateway.events
from core.codes import Code
from core.config.load import load_runtime_file
from core.keys import resolver_for
from core.runs import StartResult
from core.workflow.package import build_package
from devstack.postgres import PostgresCluster
from gateway.app import create_app
from gateway.auth import WWW_AUTHENTICATE
from gateway.completions import (
    BINDING_HEADER,
    CompletionCredential,
    CompletionHandler,
    load_credentials,
)
from gateway.events import SIGNATURE_HEADER, EventHandler, load_sources, sign
from gateway.routes import GatewayContext
from tests.helpers.faults import FaultStack, deployed_stack
from tests.helpers.gateway_kit import FakeBackend, client_for, verifier
from tests.reliability.exposure import EXPOSURE

pytestmark = pytest.mark.slow

ROOT: Final = Path(__file__).resolve().parents[2]
FAMILY: Final = "signed-attacks"
FIGURES: Final = ROOT / ".cache" / "reliability" / f"{FAMILY}.json"
WINDOW_SECONDS: Final = 300
"""CONTRACT §9.6: ``t`` more than 300 s from now is refused."""
EVENTS_PATH: Final = "/v1/events"
COMPLETIONS_PATH: Final = "/v1/review-completions"

PRODUCER_ACTIONS: Final = (gateway.events.AUDIT_ACTION, gateway.completions.AUDIT_ACTION)
"""``event-start`` and ``review-completion``."""

Headers = list[tuple[str, str]]
_inputs = itertools.count(1)


# ------------------------------------------------------------------------------ the target


@dataclass
class Target:
    """The running stack and the producer credentials its runtime file configures."""

    stack: FaultStack
    now: int
    """The pinned clock, in seconds since the epoch."""
    source: str
    event_key: bytes
    completion_token: str
    binding: str
    caller_token: str
    """The development issuer's producer access token (a caller's, not a producer's)."""
    accepted_runs: set[str] = field(default_factory=set)
    """Every run a control started."""

    @property
    def url(self) -> str:
        return self.stack.local.url

    def advance(self, seconds: int) -> None:
        self.now += seconds
        self.stack.pin_clock(datetime.fromtimestamp(self.now, UTC))

    def event(self, **changes: Any) -> dict[str, Any]:
        """A CloudEvent of the source, with a fresh id and distinctive data."""
        document: dict[str, Any] = {
            "specversion": "1.0",
            "id": f"evt-{uuid.uuid4().hex}",
            "source": self.source,
            "type": "org.example.application.submitted",
            "time": datetime.fromtimestamp(self.now, UTC).isoformat().replace("+00:00", "Z"),
            "data": {
                "applicationId": f"APP-{uuid.uuid4().hex[:12].upper()}",
                "applicantRef": f"applicant-{uuid.uuid4().hex}",
            },
        }
        document.update(changes)
        for value in document["data"].values():
            EXPOSURE.keep_secret(f"{FAMILY}/start-input-{next(_inputs)}", value)
        return document

    def signed(self, document: dict[str, Any], at: int | None = None) -> tuple[bytes, Headers]:
        body = json.dumps(document).encode()
        return body, [
            (SIGNATURE_HEADER, sign(self.event_key, body, self.now if at is None else at))
        ]

    def post_event(self, body: bytes, headers: Headers) -> httpx.Response:
        return httpx.post(
            self.url + EVENTS_PATH,
            content=body,
            headers=[("content-type", "application/json"), *headers],
            timeout=10,
        )

    def post_completion(self, body: bytes, headers: Headers) -> httpx.Response:
        return httpx.post(
            self.url + COMPLETIONS_PATH,
            content=body,
            headers=[("content-type", "application/json"), *headers],
            timeout=10,
        )

    def completion_headers(self, token: str | None = None, binding: str | None = None) -> Headers:
        return [
            ("authorization", f"Bearer {self.completion_token if token is None else token}"),
            (BINDING_HEADER, self.binding if binding is None else binding),
        ]

    def audited(self) -> dict[str, int]:
        """The audit journal's records of the producer routes, by action: the gateway
        appends one for every request it authenticated, before it answers."""
        counts = dict.fromkeys(PRODUCER_ACTIONS, 0)
        [journal] = self.stack.local.root.rglob("audit.jsonl")
        for line in journal.read_text("utf-8").splitlines():
            action = json.loads(line)["action"]
            if action in counts:
                counts[action] += 1
        return counts


def mac_of(header: str) -> str:
    return header.split("v1=", 1)[1]


def flip_last(hex_text: str) -> str:
    return hex_text[:-1] + ("0" if hex_text[-1] != "0" else "1")


# ------------------------------------------------------------------------------ the check


def assert_refused(response: httpx.Response, sent: Sequence[str]) -> None:
    """CONTRACT §9.5/§9.6's refusal: 401 ``authentication.refused`` as an RFC 9457 problem,
    showing none of ``sent`` (what the request carried and the secrets it was checked with)."""
    assert response.status_code == 401, f"answered {response.status_code}, not 401"
    assert response.headers.get("content-type", "").startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == Code.AUTHENTICATION_REFUSED.value, problem
    assert problem["status"] == 401 and problem["type"] == Code.AUTHENTICATION_REFUSED.type_uri
    assert isinstance(problem["title"], str) and isinstance(problem["detail"], str)
    shown = response.text + "\n" + "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    echoed = [value for value in sent if len(value) >= 8 and value in shown]
    assert not echoed, f"the answer shows {len(echoed)} value(s) the request carried"


def event_values(body: bytes, headers: Headers, target: Target) -> list[str]:
    """What an answer to an event must not show."""
    values = [target.event_key.hex(), body.decode("utf-8", "replace")]
    for _name, value in headers:
        values += [value, *[part.split("=", 1)[-1] for part in value.split(",")]]
    with contextlib.suppress(ValueError):
        document = json.loads(body)
        values += [v for v in document.values() if isinstance(v, str) and v != target.source]
        values += [v for v in document.get("data", {}).values() if isinstance(v, str)]
    return values


def completion_values(body: bytes, headers: Headers, target: Target) -> list[str]:
    """What an answer to a completion must not show."""
    values = [target.completion_token, body.decode("utf-8", "replace")]
    for name, value in headers:
        if name == "authorization":
            values += [value, value.partition(" ")[2]]
        else:
            values.append(value)
    return values


# ------------------------------------------------------------------------------ the attacks

Attack = Callable[[Target], tuple[bytes, Headers]]


def _no_signature(t: Target) -> tuple[bytes, Headers]:
    return t.signed(t.event())[0], []


def _empty_signature(t: Target) -> tuple[bytes, Headers]:
    return t.signed(t.event())[0], [(SIGNATURE_HEADER, "")]


def _signature_repeated(t: Target) -> tuple[bytes, Headers]:
    body, headers = t.signed(t.event())
    return body, headers * 2


def _signature_repeated_with_a_bad_one(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event())
    return body, [(name, value), (name, f"t={t.now},v1={'0' * 64}")]


def _one_digit_changed(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event())
    return body, [(name, flip_last(value))]


def _another_key(t: Target) -> tuple[bytes, Headers]:
    body = t.signed(t.event())[0]
    return body, [(SIGNATURE_HEADER, sign(secrets.token_bytes(32), body, t.now))]


def _hmac_of_the_body_alone(t: Target) -> tuple[bytes, Headers]:
    body = t.signed(t.event())[0]
    mac = hmac.new(t.event_key, body, hashlib.sha256).hexdigest()
    return body, [(SIGNATURE_HEADER, f"t={t.now},v1={mac}")]


def _hmac_cut_short(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event())
    return body, [(name, f"t={t.now},v1={mac_of(value)[:32]}")]


def _stale(t: Target) -> tuple[bytes, Headers]:
    return t.signed(t.event(), at=t.now - WINDOW_SECONDS - 1)


def _future(t: Target) -> tuple[bytes, Headers]:
    return t.signed(t.event(), at=t.now + WINDOW_SECONDS + 1)


def _t_changed_after_signing(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event(), at=t.now - WINDOW_SECONDS - 60)
    return body, [(name, f"t={t.now},v1={mac_of(value)}")]


def _t_missing(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event())
    return body, [(name, f"v1={mac_of(value)}")]


def _v0_only(t: Target) -> tuple[bytes, Headers]:
    body, [(name, value)] = t.signed(t.event())
    return body, [(name, f"t={t.now},v0={mac_of(value)}")]


def _altered(change: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Attack:
    def build(t: Target) -> tuple[bytes, Headers]:
        document = t.event()
        _body, headers = t.signed(document)
        return json.dumps(change(t, document)).encode(), headers

    return build


def _byte_appended(t: Target) -> tuple[bytes, Headers]:
    body, headers = t.signed(t.event())
    return body + b"\n", headers


def _reencoded(t: Target) -> tuple[bytes, Headers]:
    # The same JSON value in other bytes: the signature covers the bytes, not the value.
    document = t.event()
    _body, headers = t.signed(document)
    return json.dumps(document, indent=2, sort_keys=True).encode(), headers


def _another_events_signature(t: Target) -> tuple[bytes, Headers]:
    _other, headers = t.signed(t.event())
    return t.signed(t.event())[0], headers


def _data_repeated(t: Target) -> tuple[bytes, Headers]:
    # Validly signed, but two readers could take different "data" from it: one that keeps
    # the first member and one that keeps the last.
    document = t.event()
    other = json.dumps(t.event()["data"])
    text = json.dumps(document)[:-1] + f', "data": {other}}}'
    body = text.encode()
    return body, [(SIGNATURE_HEADER, sign(t.event_key, body, t.now))]


def _unknown_source(t: Target) -> tuple[bytes, Headers]:
    return t.signed(t.event(source=f"urn:attacker:{uuid.uuid4().hex}"))


EVENT_ATTACKS: Final[dict[str, Attack]] = {
    "no-signature-header": _no_signature,
    "empty-signature-header": _empty_signature,
    "signature-header-repeated": _signature_repeated,
    "signature-header-repeated-with-a-bad-one": _signature_repeated_with_a_bad_one,
    "hmac-one-digit-changed": _one_digit_changed,
    "hmac-under-another-key": _another_key,
    "hmac-of-the-body-without-t": _hmac_of_the_body_alone,
    "hmac-cut-short": _hmac_cut_short,
    "t-stale-past-the-window": _stale,
    "t-future-past-the-window": _future,
    "t-changed-after-signing": _t_changed_after_signing,
    "t-missing": _t_missing,
    "only-an-unknown-scheme": _v0_only,
    "data-altered-after-signing": _altered(
        lambda t, d: {**d, "data": {**d["data"], "applicantRef": f"applicant-{uuid.uuid4().hex}"}}
    ),
    "id-altered-after-signing": _altered(lambda t, d: {**d, "id": f"evt-{uuid.uuid4().hex}"}),
    "source-altered-after-signing": _altered(lambda t, d: {**d, "source": "urn:attacker:x"}),
    "byte-appended-after-signing": _byte_appended,
    "reencoded-after-signing": _reencoded,
    "signature-of-another-event": _another_events_signature,
    "unknown-source": _unknown_source,
    "data-repeated-in-a-signed-body": _data_repeated,
}


def _completion(headers: Callable[[Target], Headers]) -> Attack:
    def build(t: Target) -> tuple[bytes, Headers]:
        body = json.dumps({"reviewId": f"review-{uuid.uuid4().hex}"}).encode()
        return body, headers(t)

    return build


COMPLETION_ATTACKS: Final[dict[str, Attack]] = {
    "no-headers": _completion(lambda t: []),
    "authorization-missing": _completion(lambda t: t.completion_headers()[1:]),
    "binding-missing": _completion(lambda t: t.completion_headers()[:1]),
    "token-one-character-changed": _completion(
        lambda t: t.completion_headers(token=flip_last(t.completion_token))
    ),
    "token-cut-short": _completion(lambda t: t.completion_headers(token=t.completion_token[:-1])),
    "token-extended": _completion(lambda t: t.completion_headers(token=t.completion_token + "0")),
    "token-in-another-case": _completion(
        lambda t: t.completion_headers(token=t.completion_token.upper())
    ),
    "token-of-a-caller": _completion(lambda t: t.completion_headers(token=t.caller_token)),
    "token-empty": _completion(
        lambda t: [("authorization", "Bearer"), (BINDING_HEADER, t.binding)]
    ),
    "token-in-another-scheme": _completion(
        lambda t: [("authorization", f"Token {t.completion_token}"), (BINDING_HEADER, t.binding)]
    ),
    "binding-wrong": _completion(lambda t: t.completion_headers(binding="coordinator-elsewhere")),
    "binding-in-another-case": _completion(
        lambda t: t.completion_headers(binding=t.binding.upper())
    ),
    "binding-empty": _completion(lambda t: t.completion_headers(binding="")),
    "binding-repeated": _completion(
        lambda t: [*t.completion_headers(), (BINDING_HEADER, t.binding)]
    ),
    "authorization-repeated": _completion(
        lambda t: [t.completion_headers()[0], *t.completion_headers()]
    ),
    "token-and-binding-swapped": _completion(
        lambda t: t.completion_headers(token=t.binding, binding=t.completion_token)
    ),
}

TRIED: dict[str, set[str]] = {"events": set(), "completions": set()}
REFUSED: dict[str, set[str]] = {"events": set(), "completions": set()}


# ------------------------------------------------------------------------------ fixtures


def _approval_notice(build: Path) -> list[tuple[Path, str]]:
    built = build_package(ROOT / "examples" / "approval-notice", build / "packages")
    return [(built.path, built.digest)]


@pytest.fixture(scope="module")
def target(postgres_server: PostgresCluster) -> Iterator[Target]:
    name = f"coordinator_signed_attacks_{os.getpid()}"
    database = postgres_server.create_database(name)
    try:
        with deployed_stack(
            database, FaultStack, _approval_notice, "signed", test_clock=True
        ) as stack:
            now = int(datetime.now(UTC).timestamp())
            stack.pin_clock(datetime.fromtimestamp(now, UTC))
            # At info level the gateway logs each refusal (never what was sent).
            stack.local.start_coordinator(
                "--log-level", "info", name="coordinator-signed", env=stack.env()
            )
            summary = stack.local.summary
            [completion] = summary["completions"].values()
            made = Target(
                stack=stack,
                now=now,
                source=summary["eventSource"]["source"],
                event_key=Path(summary["eventSource"]["keyFile"]).read_bytes(),
                completion_token=Path(completion["tokenFile"]).read_text().strip(),
                binding=completion["recipientBinding"],
                caller_token=stack.producer_token,
            )
            yield made
            EXPOSURE.keep_stack(FAMILY, stack)
    finally:
        postgres_server.drop_database(name)


# ------------------------------------------------------------------------------ controls


def test_a_signed_event_is_accepted_at_now_and_at_both_edges_of_the_window(
    target: Target,
) -> None:
    before = target.audited()["event-start"]
    for at in (target.now, target.now - WINDOW_SECONDS, target.now + WINDOW_SECONDS):
        body, headers = target.signed(target.event(), at=at)
        answer = target.post_event(body, headers)
        assert answer.status_code == 201, answer.text
        target.accepted_runs.add(answer.json()["runId"])
    assert target.audited()["event-start"] == before + 3


def test_a_valid_completion_is_accepted(target: Target) -> None:
    before = target.audited()["review-completion"]
    body = json.dumps({"reviewId": f"review-{uuid.uuid4().hex}"}).encode()
    answer = target.post_completion(body, target.completion_headers())
    assert answer.status_code == 202, answer.text
    assert target.audited()["review-completion"] == before + 1


# ------------------------------------------------------------------------------ attacks


@pytest.mark.parametrize("attack", list(EVENT_ATTACKS))
def test_the_event_attack_is_refused(target: Target, attack: str) -> None:
    body, headers = EVENT_ATTACKS[attack](target)
    TRIED["events"].add(attack)
    before = target.audited()

    answer = target.post_event(body, headers)

    EXPOSURE.keep_response(f"{FAMILY}/event-answers", answer)
    assert_refused(answer, event_values(body, headers, target))
    assert target.audited() == before, "a refused event reached the components"
    REFUSED["events"].add(attack)


@pytest.mark.parametrize("attack", list(COMPLETION_ATTACKS))
def test_the_completion_attack_is_refused(target: Target, attack: str) -> None:
    body, headers = COMPLETION_ATTACKS[attack](target)
    TRIED["completions"].add(attack)
    before = target.audited()

    answer = target.post_completion(body, headers)

    EXPOSURE.keep_response(f"{FAMILY}/completion-answers", answer)
    assert_refused(answer, completion_values(body, headers, target))
    assert answer.headers.get_list("www-authenticate") == [WWW_AUTHENTICATE]
    assert target.audited() == before, "a refused completion reached the components"
    REFUSED["completions"].add(attack)


def test_an_accepted_event_replayed_after_its_window_is_refused(target: Target) -> None:
    body, headers = target.signed(target.event())
    first = target.post_event(body, headers)
    assert first.status_code == 201, first.text
    run_id = first.json()["runId"]
    target.accepted_runs.add(run_id)
    TRIED["events"].add("replayed-after-the-window")

    target.advance(WINDOW_SECONDS + 1)
    before = target.audited()
    replayed = target.post_event(body, headers)

    assert_refused(replayed, event_values(body, headers, target))
    assert target.audited() == before
    REFUSED["events"].add("replayed-after-the-window")
    # Signed afresh, the same event is a redelivery: the same run, not a second one.
    again = target.post_event(*target.signed(json.loads(body)))
    assert again.status_code == 200, again.text
    assert again.json()["runId"] == run_id


def test_no_run_exists_but_the_controls(target: Target) -> None:
    """Runs last among the stack's tests: every refused event started nothing."""
    assert len(target.accepted_runs) == 4
    assert set(target.stack.stored_run_ids()) == target.accepted_runs


# ------------------------------------------------------------------------------ in-process:
# the comparisons, and the broken variants


class RecordingHmac:
    """Stands in for the ``hmac`` module of a gateway module: records every
    ``compare_digest``, and answers it truthfully or with ``answer``."""

    def __init__(self, answer: bool | None = None) -> None:
        self.answer = answer
        self.compared: list[tuple[bytes | str, bytes | str]] = []
        self.new = hmac.new

    def compare_digest(self, a: Any, b: Any) -> bool:
        self.compared.append((a, b))
        return hmac.compare_digest(a, b) if self.answer is None else self.answer


@dataclass
class InProcess:
    """The gateway app in this process with the stack's producer credentials (read from its
    runtime file and secret files) and recording hooks behind the routes."""

    client: httpx.AsyncClient
    credentials: tuple[CompletionCredential, ...]
    woken: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def in_process(target: Target) -> AsyncIterator[InProcess]:
    config = load_runtime_file(target.stack.local.runtime_file)
    resolver = resolver_for(config)
    credentials = load_credentials(config, resolver)
    woken: list[str] = []
    started: list[str] = []

    async def wake(connection: str, review_id: str) -> None:
        woken.append(review_id)

    async def start(source: str, event_id: str, data_json: str) -> StartResult:
        started.append(event_id)
        return StartResult(True, str(uuid.uuid4()), {"state": "running"})

    ctx = GatewayContext(
        backend=FakeBackend(),
        verifier=verifier(),
        policies={},
        public_url=target.url,
        completions=CompletionHandler(credentials, wake),
        events=EventHandler(load_sources(config, resolver), start, now=lambda: target.now),
    )
    async with client_for(create_app(ctx)) as client:
        yield InProcess(client, credentials, woken, started)


@contextlib.contextmanager
def hmac_of(module: Any, recorder: RecordingHmac) -> Iterator[RecordingHmac]:
    """``module`` (a gateway module) uses ``recorder`` as its ``hmac`` within the block."""
    saved = module.hmac
    setattr(module, "hmac", recorder)  # noqa: B010 - a module attribute, set and restored
    try:
        yield recorder
    finally:
        setattr(module, "hmac", saved)  # noqa: B010


async def check_compared_in_constant_time(gateway_: InProcess) -> None:
    """Every configured token and binding is compared with ``compare_digest`` (each
    credential, whatever matched), and its answer alone decides: a right pair is refused
    when it says "different", a wrong pair accepted when it says "same"."""
    [right] = gateway_.credentials
    wrong = flip_last(right.token.decode())
    cases = [
        (None, right.token.decode(), 202),
        (None, wrong, 401),
        (False, right.token.decode(), 401),
        (True, wrong, 202),
    ]
    for answer, token, status in cases:
        headers = {"authorization": f"Bearer {token}", BINDING_HEADER: right.binding.decode()}
        with hmac_of(gateway.completions, RecordingHmac(answer)) as recorder:
            got = await gateway_.client.post(
                COMPLETIONS_PATH, json={"reviewId": "review-1"}, headers=headers
            )
        compared = sorted(recorder.compared)
        expected = sorted([(right.token, token.encode()), (right.binding, right.binding)])
        assert compared == expected, "the credentials were not compared with compare_digest"
        assert got.status_code == status, (
            f"compare_digest said {answer}; answered {got.status_code}"
        )


async def test_completion_credentials_are_compared_in_constant_time(target: Target) -> None:
    async with in_process(target) as gateway_:
        await check_compared_in_constant_time(gateway_)
        assert gateway_.woken == ["review-1", "review-1"]


async def test_event_signatures_are_compared_in_constant_time(target: Target) -> None:
    async with in_process(target) as gateway_:
        body, [(name, value)] = target.signed(target.event())
        expected = hmac.new(
            target.event_key, f"{target.now}.".encode() + body, hashlib.sha256
        ).hexdigest()
        bad = f"t={target.now},v1={flip_last(mac_of(value))}"
        for answer, header, status in [
            (None, value, 201),
            (None, bad, 401),
            (False, value, 401),
            (True, bad, 201),
        ]:
            with hmac_of(gateway.events, RecordingHmac(answer)) as recorder:
                got = await gateway_.client.post(EVENTS_PATH, content=body, headers={name: header})
            assert recorder.compared == [(expected, mac_of(header))]
            assert got.status_code == status, (answer, got.status_code)
        # Freshness is its own check: a stale t stays refused whatever the comparison says.
        stale_body, stale = target.signed(target.event(), at=target.now - WINDOW_SECONDS - 1)
        with hmac_of(gateway.events, RecordingHmac(True)):
            got = await gateway_.client.post(EVENTS_PATH, content=stale_body, headers=stale)
        assert got.status_code == 401
        assert len(gateway_.started) == 2


async def test_a_gateway_without_its_freshness_check_fails_the_window_attacks(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway.events, "fresh", lambda signature, now: True)
    async with in_process(target) as gateway_:
        for attack in ("t-stale-past-the-window", "t-future-past-the-window"):
            body, headers = EVENT_ATTACKS[attack](target)
            got = await gateway_.client.post(EVENTS_PATH, content=body, headers=headers)
            with pytest.raises(AssertionError, match="answered 201, not 401"):
                assert_refused(got, event_values(body, headers, target))
        assert len(gateway_.started) == 2


async def test_a_completion_match_written_with_equality_fails_the_constant_time_check(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    def match_with_equality(
        credentials: Sequence[CompletionCredential], token: bytes, binding: bytes
    ) -> str | None:
        for credential in credentials:
            if credential.token == token and credential.binding == binding:
                return credential.connection
        return None

    monkeypatch.setattr(gateway.completions, "match", match_with_equality)
    async with in_process(target) as gateway_:
        with pytest.raises(AssertionError, match="not compared with compare_digest"):
            await check_compared_in_constant_time(gateway_)
        # It still tells a right pair from a wrong one: only the way it compares is broken.
        headers = {"authorization": f"Bearer {target.completion_token}"}
        headers[BINDING_HEADER] = target.binding
        right = await gateway_.client.post(
            COMPLETIONS_PATH, json={"reviewId": "r"}, headers=headers
        )
        headers["authorization"] += "0"
        wrong = await gateway_.client.post(
            COMPLETIONS_PATH, json={"reviewId": "r"}, headers=headers
        )
        assert (right.status_code, wrong.status_code) == (202, 401)


def test_the_echo_check_finds_what_a_request_carried(target: Target) -> None:
    """:func:`assert_refused` fails on a 401 problem that shows the presented binding."""
    problem = {
        "type": Code.AUTHENTICATION_REFUSED.type_uri,
        "title": "Authentication refused",
        "status": 401,
        "detail": f"no connection has the binding {target.binding}",
        "code": Code.AUTHENTICATION_REFUSED.value,
    }
    answer = httpx.Response(401, json=problem, headers={"content-type": "application/problem+json"})
    with pytest.raises(AssertionError, match="shows 1 value"):
        assert_refused(answer, completion_values(b"{}", target.completion_headers(), target))


# ------------------------------------------------------------------------------ figures


def test_figures_every_attack_tried_was_refused() -> None:
    """Runs last in the module: the family's figures, written and printed."""
    figures = {
        route: {
            "tried": len(TRIED[route]),
            "refused": len(REFUSED[route]),
            "notRefused": sorted(TRIED[route] - REFUSED[route]),
        }
        for route in ("events", "completions")
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nsigned attacks: {json.dumps(figures)}")
    assert TRIED["events"] == REFUSED["events"] == {*EVENT_ATTACKS, "replayed-after-the-window"}
    assert TRIED["completions"] == REFUSED["completions"] == set(COMPLETION_ATTACKS)
