"""Requests generated from ``docs/openapi.yaml`` by schemathesis, sent to a running stack.

:func:`planned_requests` is a Hypothesis strategy of requests for one operation of the
document: a schemathesis case — positive (fits the document) or negative (breaks it
somewhere) — completed with what schemathesis cannot know about our deployment:

- the credentials, drawn from the variants of the operation's security scheme
  (:data:`BEARER_VARIANTS`, :data:`COMPLETION_VARIANTS`, :data:`EVENT_VARIANTS`): the right
  role's token, another role's, none, garbage, a credential of another kind, and whatever
  schemathesis generated. Each case goes out :data:`CREDENTIALS_PER_CASE` times, each time
  with another variant;
- run ids and workflow ids that exist, in place of the generated ones half the time, so
  that status, inspection, run actions and starts reach real runs and workflows;
- now and then a start input or event data that fits the workflow (runs really start), an
  event signed with the source's key over the exact bytes sent, a ``HEAD`` for a ``GET``,
  and a method the route does not take.

:class:`FuzzSession` sends each request with httpx, judges the answer with
:func:`tests.reliability.fuzz_check.answer_faults` and — for a request sent as the document
describes it — with schemathesis's own conformance checks (:data:`CONFORMANCE`), and keeps
the tally. :data:`WEIGHTS` says how many of the requests each operation gets.

A 503 is judged with what the session knows of the moment (:class:`Conditions`): the
dependencies a test took down inside :meth:`FuzzSession.outage`, and whether the gateway's
count of requests refused at ``maxConnections`` rose since the session last read it (read
from ``/metrics`` when a 503 comes, so it costs nothing while none does).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import Case, GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation, BaseSchema
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.fuzz_check import (
    Answer,
    Conditions,
    Secrets,
    Sent,
    answer_faults,
    echoes,
)

BEARER_VARIANTS: Final = ("producer", "operator", "none", "garbage", "generated", "completion")
"""Credentials of a route that takes an access token; ``completion`` is Casework's opaque
completion token, a credential of another kind."""
COMPLETION_VARIANTS: Final = (
    "completion",
    "none",
    "garbage",
    "wrong-binding",
    "operator",
    "generated",
)
EVENT_VARIANTS: Final = ("signed", "none", "stale", "wrong-key", "generated")
OPEN_VARIANTS: Final = ("generated", "operator")
CREDENTIALS_PER_CASE: Final = 2
"""Each generated case is sent this many times, each time with another credential: the
same request with and without a usable credential shows the order of checks holds."""
"""``/ready`` and ``/metrics`` take no credential; a token sent anyway changes nothing."""

# Valid credentials twice as often: they get past authentication into the code behind it.
_BEARER_WEIGHTS: Final = {"producer": 3, "operator": 3}
_COMPLETION_WEIGHTS: Final = {"completion": 3}
_EVENT_WEIGHTS: Final = {"signed": 4}

WEIGHTS: Final[Mapping[str, int]] = {
    "startRun": 4,
    "postSignedEvent": 3,
    "listRuns": 2,
    "getRunStatus": 2,
    "getRunInspection": 2,
    "reconcileRun": 2,
    "retrySameRun": 2,
    "cancelRun": 2,
    "bulkRetrySame": 1,
    "bulkCancel": 1,
    "bulkReconcile": 1,
    "postReviewCompletion": 2,
    "retainRuns": 2,
    "placeRestoreHold": 1,
    "completeExecutionRecovery": 1,
    "releaseRestoreHold": 1,
    "releaseAdmissionHold": 1,
    "getDoctorReport": 1,
    "getReadiness": 1,
    "getMetrics": 1,
}
"""Each operation's share of the requests. Every operation of the document must be here."""

OTHER_METHODS: Final = ("PUT", "DELETE", "PATCH", "OPTIONS")
SIGNATURE_HEADER: Final = "registry-event-signature"
BINDING_HEADER: Final = "registry-recipient-binding"
STALE_SECONDS: Final = 3600


@dataclass(frozen=True)
class Target:
    """The running deployment and what the fuzzer may know of it."""

    base_url: str
    metrics_url: str
    producer_token: str
    operator_token: str
    completion_token: str
    completion_binding: str
    event_source: str
    event_key: bytes = field(repr=False)
    run_ids: Sequence[str]
    workflow_ids: Sequence[str]
    inputs: Mapping[str, Callable[[str], dict[str, Any]]]
    """A valid start input of each workflow, built around a distinctive marker."""
    event_workflow: str


@dataclass(frozen=True)
class Planned:
    """One request, ready to send."""

    operation: str
    mode: str
    credential: str
    method: str
    url: str
    query: list[tuple[str, str | int | float | bool | None]]
    headers: dict[str, str]
    content: bytes | None
    body: Any
    """The JSON value of the body (or its raw bytes), for the echo check."""
    extra_credentials: tuple[str, ...] = ()
    """Garbage tokens and signatures this request carried."""
    markers: tuple[str, ...] = ()
    """Distinctive values placed in a valid input."""
    case: FuzzCase | None = None
    """The schemathesis case, when the request is the operation as the document has it
    (its method, its listener): schemathesis then checks the answer against the document."""


Operation = APIOperation[Any, Any, Any, Any]
FuzzCase = Case[Operation]


def operations(schema: BaseSchema) -> dict[str, Operation]:
    """Every operation of the document by its ``operationId``."""
    found: dict[str, Operation] = {}
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise AssertionError("docs/openapi.yaml holds an operation schemathesis cannot read")
        operation = result.ok()
        operation_id = str(operation.definition.raw["operationId"])
        found[operation_id] = operation
    return found


def security_of(schema: BaseSchema, operation: Operation) -> str:
    """``bearer``, ``completion``, ``event`` or ``open``."""
    raw = operation.definition.raw
    requirements = raw.get("security", schema.raw_schema.get("security", []))
    names = {name for requirement in requirements for name in requirement}
    if "eventSignature" in names:
        return "event"
    if "completionToken" in names:
        return "completion"
    if "accessToken" in names:
        return "bearer"
    return "open"


def _credentials(security: str, rng: random.Random) -> list[str]:
    """:data:`CREDENTIALS_PER_CASE` different variants of the scheme, drawn by weight."""
    variants, weights = {
        "bearer": (BEARER_VARIANTS, _BEARER_WEIGHTS),
        "completion": (COMPLETION_VARIANTS, _COMPLETION_WEIGHTS),
        "event": (EVENT_VARIANTS, _EVENT_WEIGHTS),
    }.get(security, (OPEN_VARIANTS, {}))
    chosen: list[str] = []
    while len(chosen) < min(CREDENTIALS_PER_CASE, len(variants)):
        left = [v for v in variants if v not in chosen]
        chosen += rng.choices(left, [weights.get(v, 1) for v in left])
    return chosen


def _hex(rng: random.Random) -> str:
    return f"{rng.getrandbits(96):024x}"


def _query_pairs(
    params: Mapping[str, Any] | None,
) -> list[tuple[str, str | int | float | bool | None]]:
    pairs: list[tuple[str, str | int | float | bool | None]] = []
    for name, value in (params or {}).items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            text = item if isinstance(item, str) else json.dumps(item)
            pairs.append((str(name), text))
    return pairs


def _encode(value: Any, ascii_only: bool) -> bytes:
    if not ascii_only:
        try:
            return json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate travels escaped, as \udxxx
    return json.dumps(value).encode("ascii")


def _member(content: bytes, member: bytes) -> bytes:
    """``content`` (a JSON object's text) with ``member`` as its first member."""
    rest = content[1:].lstrip()
    return b"{" + member + (b"" if rest.startswith(b"}") else b",") + rest


MUTATIONS: Final[Mapping[str, Callable[[bytes, random.Random], bytes]]] = {
    "beyond-double": lambda c, _: _member(c, b'"zz":1e999'),
    "negative-beyond-double": lambda c, _: _member(c, b'"zz":[-1e400]'),
    "lone-surrogate": lambda c, _: _member(c, b'"zz":"\\ud800"'),
    "surrogate-name": lambda c, _: _member(c, b'"\\udfff":1'),
    "repeated-member": lambda c, _: _member(_member(c, b'"zz":1'), b'"zz":2'),
    "deep": lambda c, _: _member(c, b'"zz":' + b"[" * 40 + b"]" * 40),
    "truncated": lambda c, rng: c[: rng.randrange(1, len(c))] if len(c) > 1 else b"{",
    "not-utf-8": lambda c, _: _member(c, b'"zz":"\xff\xfe"'),
    "too-large": lambda c, _: c + b" " * (70 * 1024),
}
"""Hostile encodings of a JSON body that no schema describes, applied to a share
(:data:`MUTATED`) of the generated bodies before any signature is computed over them."""
MUTATED: Final = 0.1


def _mac(key: bytes, timestamp: int, content: bytes) -> str:
    text = str(timestamp).encode("ascii") + b"." + content
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def planned_requests(
    schema: BaseSchema,
    target: Target,
    name: str,
    mode: GenerationMode,
    seed: str,
    now: Callable[[], float] = time.time,
) -> st.SearchStrategy[tuple[Planned, ...]]:
    """Requests for the operation ``name`` of ``schema`` in ``mode``, as described in the
    module: each generated case as :data:`CREDENTIALS_PER_CASE` requests that differ in
    their credentials. ``seed`` seeds the choices that are ours (credentials, ids,
    methods)."""
    operation = operations(schema)[name]
    strategy = operation.as_strategy(generation_mode=mode)
    security = security_of(schema, operation)
    numbers = itertools.count()

    @st.composite
    def planned(draw: st.DrawFn) -> tuple[Planned, ...]:
        case = draw(strategy)
        # Our own choices come from a generator seeded with the example's number: uniform
        # by the weights and different for each example, where Hypothesis's own draws lean
        # towards the first of a list and repeat what earlier examples drew. They come
        # after the one draw, so that Hypothesis sees the same draws for the same data.
        rng = random.Random(f"{seed}-{next(numbers)}")  # noqa: S311 - reproducible on purpose
        # Real runs and workflows half the time, the generated text otherwise.
        if "runId" in case.path_parameters and rng.random() < 0.5:
            case.path_parameters = {"runId": rng.choice(list(target.run_ids))}
        if "workflowId" in case.path_parameters and rng.random() < 0.5:
            case.path_parameters = {"workflowId": rng.choice(list(target.workflow_ids))}
        kwargs = case.as_transport_kwargs(base_url="http://fuzz.invalid")
        generated = {
            str(k): str(v)
            for k, v in (kwargs.get("headers") or {}).items()
            if str(k).lower() not in ("user-agent", "accept-encoding", "connection")
        }
        body, markers = _body(name, case.path_parameters.get("workflowId"), kwargs, target, rng)
        content: bytes | None = None
        if isinstance(body, bytes):
            content = body
        elif body is not None or "json" in kwargs:
            content = _encode(body, ascii_only=rng.random() < 0.5)
        mutation = ""
        if content is not None and content.startswith(b"{") and rng.random() < MUTATED:
            mutation = rng.choice(sorted(MUTATIONS))
            content = MUTATIONS[mutation](content, rng)
        method = str(kwargs["method"]).upper()
        roll = rng.random()
        if method == "GET" and roll < 0.15:
            method = "HEAD"
        elif roll > 0.95:
            method = rng.choice([m for m in OTHER_METHODS if m != method])
        base = target.metrics_url if name == "getMetrics" else target.base_url
        if name == "getMetrics" and 0.85 < roll <= 0.95:
            base = target.base_url  # never served on the main listener
        documented = method == str(kwargs["method"]).upper() and not (
            name == "getMetrics" and base != target.metrics_url
        )
        requests = []
        for credential in _credentials(security, rng):
            headers, extra = _with_credential(
                credential, security, generated, content, target, rng, now
            )
            requests.append(
                Planned(
                    operation=name,
                    mode=f"{mode.value}+{mutation}" if mutation else mode.value,
                    credential=credential,
                    method=method,
                    url=base + case.formatted_path,
                    query=_query_pairs(kwargs.get("params")),
                    headers=headers,
                    content=content,
                    body=body,
                    extra_credentials=extra,
                    markers=markers,
                    case=case if documented else None,
                )
            )
        return tuple(requests)

    return planned()


def _body(
    name: str,
    workflow: str | None,
    kwargs: Mapping[str, Any],
    target: Target,
    rng: random.Random,
) -> tuple[Any, tuple[str, ...]]:
    """The body to send (the generated one, or a valid start input or event now and then)
    and the distinctive markers placed in it."""
    body: Any = None
    if "json" in kwargs:
        body = kwargs["json"]
    elif "data" in kwargs:
        data = kwargs["data"]
        body = data if isinstance(data, bytes) else str(data).encode("utf-8")
    markers: list[str] = []
    if (
        name == "startRun"
        and workflow is not None
        and workflow in target.inputs
        and rng.random() < 0.3
    ):
        markers.append(_hex(rng))
        body = {"input": target.inputs[workflow](markers[-1])}
    if name == "postSignedEvent" and isinstance(body, dict) and rng.random() < 0.5:
        # Past the signature check when signed: a configured source, often with data that
        # fits its workflow.
        body = {**body, "source": target.event_source}
        if rng.random() < 0.5:
            markers.append(_hex(rng))
            body["data"] = target.inputs[target.event_workflow](markers[-1])
            body["id"] = f"evt-{_hex(rng)}"
    return body, tuple(markers)


def _with_credential(
    credential: str,
    security: str,
    generated: Mapping[str, str],
    content: bytes | None,
    target: Target,
    rng: random.Random,
    now: Callable[[], float],
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The headers of one request carrying ``credential``, and the garbage or signature it
    holds (which no answer may repeat)."""
    headers = dict(generated)
    # The generated credentials stay only in the "generated" variant.
    if credential != "generated":
        headers = {
            k: v
            for k, v in headers.items()
            if k.lower() not in ("authorization", SIGNATURE_HEADER, BINDING_HEADER)
        }
    garbage = f"fz{_hex(rng)}"
    if credential == "producer":
        headers["Authorization"] = f"Bearer {target.producer_token}"
    elif credential in ("operator", "completion"):
        token = target.operator_token if credential == "operator" else target.completion_token
        headers["Authorization"] = f"Bearer {token}"
        if security == "completion":
            headers[BINDING_HEADER] = target.completion_binding
    elif credential == "garbage":
        if security == "event":
            headers[SIGNATURE_HEADER] = f"t={int(now())},v1={garbage}"
        else:
            headers["Authorization"] = f"Bearer {garbage}"
            if security == "completion":
                headers[BINDING_HEADER] = target.completion_binding
        return headers, (garbage,)
    elif credential == "wrong-binding":
        headers["Authorization"] = f"Bearer {target.completion_token}"
        headers[BINDING_HEADER] = f"binding-{garbage}"
    elif credential in ("signed", "stale", "wrong-key"):
        stamp = int(now()) - (STALE_SECONDS if credential == "stale" else 0)
        key = target.event_key if credential != "wrong-key" else garbage.encode()
        mac = _mac(key, stamp, content or b"")
        headers[SIGNATURE_HEADER] = f"t={stamp},v1={mac}"
        return headers, (mac,)
    return headers, ()


@dataclass
class Tally:
    """What the session sent and saw."""

    cases: int = 0
    """Cases schemathesis generated (each sent with :data:`CREDENTIALS_PER_CASE` credentials)."""
    sent: int = 0
    unsendable: int = 0
    """Requests httpx would not put on the wire (a header value it refuses, …)."""
    server_errors: int = 0
    """Answers 5xx other than 503."""
    unavailable: int = 0
    """Answers 503."""
    statuses: Counter[int] = field(default_factory=Counter)
    by_operation: dict[str, Counter[str]] = field(default_factory=dict)
    by_credential: Counter[str] = field(default_factory=Counter)
    by_mode: Counter[str] = field(default_factory=Counter)
    """Positive or negative, and the hostile encoding (:data:`MUTATIONS`) if any."""
    faults: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    """``(operation, fault)`` → ``[count, first example]``."""
    seconds: float = 0.0
    """Time spent sending and waiting for answers."""
    wall_seconds: float = 0.0
    """The whole run: generating, sending, judging."""

    def figures(self) -> dict[str, Any]:
        return {
            "casesGenerated": self.cases,
            "requestsSent": self.sent,
            "unsendable": self.unsendable,
            "answers5xxOtherThan503": self.server_errors,
            "answers503": self.unavailable,
            "faultyAnswers": sum(entry[0] for entry in self.faults.values()),
            "seconds": round(self.seconds, 1),
            "wallSeconds": round(self.wall_seconds, 1),
            "requestsPerWallSecond": (
                round(self.sent / self.wall_seconds, 1) if self.wall_seconds else None
            ),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "byCredential": dict(sorted(self.by_credential.items())),
            "byMode": dict(sorted(self.by_mode.items())),
            "byOperation": {
                name: dict(sorted(counts.items()))
                for name, counts in sorted(self.by_operation.items())
            },
        }


OVER_LIMIT_SERIES: Final = "coordinator_http_requests_total"
OVER_LIMIT_ROUTE: Final = "over-limit"
"""The series and ``route`` label the gateway counts its ``maxConnections`` refusals under
(``gateway/metrics.py``)."""


def over_limit_count(client: httpx.Client, metrics_url: str) -> float | None:
    """How many requests the gateway's listeners have refused at ``maxConnections`` so
    far; None when ``/metrics`` cannot be read."""
    try:
        page = client.get(metrics_url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    if page.status_code != 200:
        return None
    try:
        return sum(
            sample.value
            for family in text_string_to_metric_families(page.text)
            for sample in family.samples
            if sample.name == OVER_LIMIT_SERIES and sample.labels.get("route") == OVER_LIMIT_ROUTE
        )
    except ValueError:
        return None  # not Prometheus text: as unreadable as no answer


class FuzzSession:
    """Sends planned requests, judges each answer, keeps the tally."""

    def __init__(
        self,
        target: Target,
        secrets: Secrets,
        keep: Callable[[Planned, httpx.Response], None],
        over_limit: Callable[[], float | None] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``over_limit`` reads the gateway's over-limit count (:func:`over_limit_count`
        by default); ``transport`` replaces the network (for tests of the session)."""
        self.target = target
        self.secrets = secrets
        self.keep = keep
        self.tally = Tally()
        self.client = httpx.Client(timeout=httpx.Timeout(30.0), transport=transport)
        self._over_limit = over_limit or (lambda: over_limit_count(self.client, target.metrics_url))
        self._refused: float | None = None
        """The over-limit count last read (None: not read, or unreadable)."""
        self._counting = False
        self._down: Counter[str] = Counter()

    def close(self) -> None:
        self.client.close()

    @contextlib.contextmanager
    def outage(self, dependency: str) -> Iterator[None]:
        """Judge the answers of the block knowing ``dependency`` is down. Take it down inside
        the block, and leave the block only once the deployment says it is ready again: a
        503 after the block is a fault."""
        self._down[dependency] += 1
        try:
            yield
        finally:
            self._down[dependency] -= 1
            if self._down[dependency] <= 0:
                del self._down[dependency]

    def conditions(self, status: int) -> Conditions:
        """What the deployment is going through, as far as an answer with ``status`` needs."""
        down = tuple(sorted(self._down))
        if status != 503 or down:
            return Conditions(down=down)
        before, now = self._refused, self._over_limit()
        # Unreadable, before or now: the rise cannot be shown, and the 503 stays a fault.
        rose = before is not None and now is not None and now > before
        if now is not None:
            self._refused = now
        return Conditions(down=down, over_limit=rose)

    def send(self, planned: Planned) -> None:
        if not self._counting:
            # The count before the first request: a rise is what the session's requests met.
            self._counting = True
            self._refused = self._over_limit()
        started = time.monotonic()
        try:
            request = self.client.build_request(
                planned.method,
                planned.url,
                params=planned.query,
                headers=planned.headers,
                content=planned.content,
            )
            response = self.client.send(request)
        except (httpx.LocalProtocolError, httpx.InvalidURL, UnicodeEncodeError, ValueError):
            self.tally.unsendable += 1
            return
        finally:
            self.tally.seconds += time.monotonic() - started
        self.judge(planned, request, response)

    def judge(self, planned: Planned, request: httpx.Request, response: httpx.Response) -> None:
        tally = self.tally
        tally.sent += 1
        tally.statuses[response.status_code] += 1
        tally.by_credential[planned.credential] += 1
        tally.by_mode[planned.mode] += 1
        counts = tally.by_operation.setdefault(planned.operation, Counter())
        counts["sent"] += 1
        counts[f"credential:{planned.credential}"] += 1
        counts[f"{response.status_code // 100}xx"] += 1
        counts[f"{response.status_code} {_code_of(response)}".strip()] += 1
        if response.status_code == 503:
            tally.unavailable += 1
            counts["503"] += 1
        elif response.status_code >= 500:
            tally.server_errors += 1
        raw_path = request.url.raw_path.split(b"?", 1)[0].decode("ascii")
        sent = Sent(
            method=planned.method,
            path=raw_path,
            query=dict(planned.query),
            headers=planned.headers,
            body=planned.body,
        )
        answer = Answer(
            status=response.status_code,
            headers={k.lower(): v for k, v in response.headers.items()},
            body=response.content,
        )
        secrets = Secrets(
            credentials=(*self.secrets.credentials, *planned.extra_credentials),
            known=self.secrets.known,
            document_strings=self.secrets.document_strings,
            public_url=self.secrets.public_url,
        )
        conditions = self.conditions(response.status_code)
        faults = answer_faults(sent, answer, secrets, conditions)
        if planned.case is not None:
            faults += conformance_faults(planned.case, response)
        for fault in faults:
            entry = tally.faults.setdefault((planned.operation, fault), [0, None])
            entry[0] += 1
            if entry[1] is None:
                entry[1] = (
                    f"{planned.method} {raw_path} [{planned.mode}, {planned.credential}] "
                    f"query {planned.query!r} body {planned.body!r:.600} → "
                    f"{response.status_code} {response.content[:1500]!r}; "
                    f"echoed {echoes(sent, answer, secrets)!r}"
                )
        self.keep(planned, response)


def _code_of(response: httpx.Response) -> str:
    media_type = response.headers.get("content-type", "")
    if not response.content or not media_type.startswith("application/problem+json"):
        return ""
    try:
        document = response.json()
    except ValueError:
        return "(unreadable)"
    return str(document.get("code", "")) if isinstance(document, dict) else ""


CONFORMANCE: Final = (
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
)
"""schemathesis's own checks of an answer against the document: a documented status for
the operation, a documented media type, the documented headers, the documented schema."""


def conformance_faults(case: FuzzCase, response: httpx.Response) -> list[str]:
    """What schemathesis finds wrong with ``response`` to ``case`` by :data:`CONFORMANCE`."""
    try:
        case.validate_response(response, checks=list(CONFORMANCE))
    except FailureGroup as failures:
        return sorted({f"schemathesis: {failure.title}" for failure in failures.exceptions})
    return []
