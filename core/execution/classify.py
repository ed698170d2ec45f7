"""What a product's answer to a command means (CONTRACT §9.3 step 4). Pure functions.

Four results, and the only question each one answers is "could the product have processed
this command?":

- ``accepted``: a 2xx answer whose body is a JSON object. The product took the command.
- ``retryable``: the product certainly did not process it — the connection was never
  established, or it answered 429, or 503 with the problem code ``service.unavailable``.
  The same command is sent again later with the same key. A TLS handshake that failed
  verification sent nothing either, but a certificate does not mend by itself: that one
  carries the cause ``tls-refused``, which the step shows and its run's attention follows
  (CONTRACT §9.3, "Untrusted endpoints are visible").
- ``refused``: 400, 401, 403, 404, 409 or 422 — the product looked at the command and said
  no. (The caller handles 401's one resend with a fresh token.)
- ``uncertain``: anything else, including a 2xx whose body cannot be read, a 5xx other than
  the retryable 503, a timeout or reset after the request went out, an answer that breaks
  HTTP/1.1 framing or is too large. Nobody can tell whether it was processed, so it is
  never resent automatically. Each carries a ``cause`` (CONTRACT §8.4) the step records.
- ``unsendable``: the request was refused here before a byte was written (a header with a
  line break, a URL the client cannot send to). It was never sent and never will be: the
  run fails ``invalid-command``.

What the HTTP client reports is an :class:`core.products.http.ExchangeFailure`; only one
proven to happen before the request's first byte left (the connection never existed, or its
TLS handshake failed) is retryable.

``reason`` strings name the status and problem code or the failure class only; they never
quote a body, since a product's answer may carry personal data.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from core.canonical import parse_json
from core.products.http import UNREADABLE_ANSWER, UNSENDABLE, ExchangeFailure
from core.states import RetryCause, SentNothing

ACCEPTED: Final = "accepted"
RETRYABLE: Final = "retryable"
REFUSED: Final = "refused"
UNCERTAIN: Final = "uncertain"
NOT_SENDABLE: Final = "unsendable"
RESULTS: Final = (ACCEPTED, RETRYABLE, REFUSED, UNCERTAIN)
STATUS_5XX: Final = "status-5xx"
LEASE_EXPIRED: Final = "lease-expired"
"""The cause of a step found prepared with no dispatcher left to say whether it was sent."""

RETRY_FIRST_SECONDS: Final = 1.0
"""The first delay after a definite retryable answer (the production value)."""
RETRY_CAP_SECONDS: Final = 300.0
"""The longest delay between automatic retries (the production value)."""

REFUSAL_STATUSES: Final = frozenset({400, 401, 403, 404, 409, 422})
RETRYABLE_PROBLEM: Final = "service.unavailable"
_CODE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class Classified:
    """One answer (or failure) and what it means."""

    result: str
    """accepted, retryable, refused or uncertain."""
    reason: str
    """A short, value-free description for logs (``503 service.unavailable``)."""
    status: int | None = None
    """The HTTP status, when there was an answer."""
    response: dict[str, Any] | None = None
    """The parsed body of an accepted answer."""
    cause: str | None = None
    """Why an uncertain result is uncertain (CONTRACT §8.4), or why a retryable one must be
    seen by an operator (``tls-refused``); None for the others."""
    retry_after: float | None = None
    """For a retryable answer (429, 503): the seconds its ``Retry-After`` asked to wait."""

    @property
    def cause_status(self) -> int | None:
        """The status a ``status-5xx`` cause names."""
        return self.status if self.cause == STATUS_5XX else None


def _json(body: bytes) -> Any:
    try:
        return parse_json(body)
    except (UnicodeDecodeError, ValueError):
        return None


def _problem_code(body: bytes) -> str | None:
    document = _json(body)
    code = document.get("code") if isinstance(document, dict) else None
    # Only a code-shaped value is repeated: reasons go to logs.
    if isinstance(code, str) and _CODE.fullmatch(code):
        return code
    return None


def classify_answer(status: int, body: bytes, retry_after: float | None = None) -> Classified:
    """Classify an HTTP answer by its status and body; a retryable one keeps the seconds
    its ``Retry-After`` asked for (:func:`retry_wait` honours them)."""
    if 200 <= status < 300:
        document = _json(body)
        if isinstance(document, dict):
            return Classified(ACCEPTED, f"{status}", status, document)
        return Classified(
            UNCERTAIN,
            f"{status} with a body that is not a JSON object",
            status,
            cause=UNREADABLE_ANSWER,
        )
    if status == 429:
        return Classified(RETRYABLE, "429", status, retry_after=retry_after)
    if status == 503:
        code = _problem_code(body)
        if code == RETRYABLE_PROBLEM:
            return Classified(
                RETRYABLE, f"503 {RETRYABLE_PROBLEM}", status, retry_after=retry_after
            )
        # A 503 from something else on the path (a proxy, a draining server) does not
        # promise that the product left the command alone.
        return Classified(UNCERTAIN, "503 without service.unavailable", status, cause=STATUS_5XX)
    if status in REFUSAL_STATUSES:
        code = _problem_code(body)
        return Classified(REFUSED, f"{status} {code}" if code else f"{status}", status)
    # A redirect, an interim or an unknown status: no answer this classification can read.
    cause = STATUS_5XX if 500 <= status <= 599 else UNREADABLE_ANSWER
    return Classified(UNCERTAIN, f"{status}", status, cause=cause)


def classify_failure(error: ExchangeFailure) -> Classified:
    """Classify a failure to get an answer at all."""
    if not error.sent:
        if error.cause == UNSENDABLE:
            return Classified(NOT_SENDABLE, "refused before sending")
        if error.cause == SentNothing.TLS_REFUSED:
            return Classified(RETRYABLE, "not sent (tls-refused)", cause=SentNothing.TLS_REFUSED)
        return Classified(RETRYABLE, f"not sent ({error.cause})")
    # The request may have reached the product.
    return Classified(UNCERTAIN, f"no answer ({error.cause})", cause=error.cause)


def retry_cause(result: Classified) -> RetryCause:
    """What a retryable ``result`` shows as its step's ``retry.lastCause`` (CONTRACT §8.4).

    Without an answer: ``tls-refused`` for a failed TLS verification, ``never-connected``
    for every other failure before a byte left. With one: 429 is ``status-429``, 401 (the
    product refused the token and the issuer gave no fresh one) is ``token-refused``, and
    503 is ``status-503``. :func:`classify_answer` makes no other status retryable (a 5xx
    but the 503 with ``service.unavailable`` is uncertain); were one ever to be, a 5xx would
    read ``status-503`` and anything below 500 ``status-429`` — the product's "not now" —
    while ``retry.lastStatus`` still shows the status itself.
    """
    if result.result != RETRYABLE:
        raise ValueError(f"not a retryable result: {result.result}")
    status = result.status
    if status is None:
        if result.cause == SentNothing.TLS_REFUSED:
            return RetryCause.TLS_REFUSED
        return RetryCause.NEVER_CONNECTED
    if status == 401:
        return RetryCause.TOKEN_REFUSED
    if status >= 500:
        return RetryCause.STATUS_503
    return RetryCause.STATUS_429


def retry_delay(
    retries: int,
    *,
    first: float = RETRY_FIRST_SECONDS,
    cap: float = RETRY_CAP_SECONDS,
    jitter: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before attempt ``retries + 1`` after ``retries`` retryable answers.

    Doubles from ``first`` up to ``cap``, plus up to a quarter more at random so that steps
    refused together by a recovering product do not come back together.
    """
    if retries < 1:
        raise ValueError("retries counts the retryable answers so far (at least 1)")
    base = min(cap, first * 2.0 ** min(retries - 1, 62))
    return float(min(cap, base * (1.0 + 0.25 * jitter())))


def retry_wait(
    retries: int,
    result: Classified,
    *,
    first: float = RETRY_FIRST_SECONDS,
    cap: float = RETRY_CAP_SECONDS,
    jitter: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before the next attempt after ``retries`` retryable answers, the last
    of them ``result``: the backoff of :func:`retry_delay`, or longer when the product's
    ``Retry-After`` asked for longer, never past ``cap`` (CONTRACT §9.3's five minutes)."""
    delay = retry_delay(retries, first=first, cap=cap, jitter=jitter)
    if result.retry_after is None:
        return delay
    return max(delay, min(float(cap), result.retry_after))
