"""Load and invariants for the reliability tier's fault families (issue 27, items 4 and 5).

:class:`LoadDriver` starts runs of the fault workflow (``tests.helpers.faults``) through the
public HTTP API, continuously, from worker threads, each start with its own idempotency key,
and records every answer: the run id of each start answered 2xx, the other statuses with one
problem document of each code, and the starts that got no answer at all. :func:`hold_calls`
and :func:`release_held` put calls in flight at a chosen moment: the stand-in processes
them and holds their answers back until told.

:func:`observe` reads, from a quiet stack, what the invariants are about: the runs the API
lists and the ones the schema owner finds in the database, the stand-in's per-key counts,
the status and inspection of every held run and of every run with an unknown effect, and the
audit journal. :func:`check_invariants` judges an :class:`Observation` and nothing else, so a
test can hand it a broken one (a lost run, a command processed twice, a held run without a
reason, a tampered journal) and see it fail:

- every run admitted with a 2xx exists, in the API's list and in the database: 0 lost;
- every call command was processed by the stand-in at most once, and sent to it at most
  once, unless an operator action of the test asked for it: 0 duplicated, 0 resent;
- every processed command belongs to a run that exists;
- every held run shows why: ``attention`` and a step whose effect is ``unknown`` with its
  cause; every unknown effect in the database is shown by inspection;
- the audit journal's hash chain verifies (:func:`core.audit.verify.verify_file`).

:func:`settle` brings a stack from load to that quiet state: it stops the driver, waits
until nothing moves, moves the coordinator's clock past the dispatcher's lease (so that a
step abandoned by a dead dispatcher, or given up while the database was away, becomes
uncertain the way §9.3 says), and waits until every run has ended or is held.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import httpx

from core.audit.format import line_hash, serialize
from core.audit.verify import verify_file
from devstack.stack import wait_until
from tests.helpers.faults import CALL_STEP, LEASE_SECONDS, WORKFLOW_ID, FaultStack
from tests.reliability.exposure import EXPOSURE

ROOT: Final = Path(__file__).resolve().parents[2]
FIGURES_DIR: Final = ROOT / ".cache" / "reliability"
SETTLED_STATES: Final = frozenset({"succeeded", "failed", "cancelled", "held"})
"""Run states nothing moves out of by itself."""
START_TIMEOUT_SECONDS: Final = 10.0
QUIET_SECONDS: Final = 1.5
"""How long nothing may change before a stack counts as quiet."""
SETTLE_SECONDS: Final = 90.0
"""Bound of the waits in :func:`settle` (generous: the machine is shared)."""
_SAMPLES_PER_CODE: Final = 1


# ------------------------------------------------------------------------------ the driver


@dataclass
class LoadFigures:
    """What a driver saw, at one moment."""

    attempted: int
    admitted: int
    statuses: dict[int, int]
    unanswered: int

    def since(self, earlier: LoadFigures) -> LoadFigures:
        """The difference from an earlier moment."""
        statuses = Counter(self.statuses)
        statuses.subtract(earlier.statuses)
        return LoadFigures(
            self.attempted - earlier.attempted,
            self.admitted - earlier.admitted,
            {status: n for status, n in statuses.items() if n},
            self.unanswered - earlier.unanswered,
        )


class LoadDriver:
    """Start runs continuously through the HTTP API from ``workers`` threads.

    Every start carries a fresh ``Idempotency-Key``; the subject is one distinctive value per
    driver (``subject``), for the secrets check. ``pause`` is the least time between two
    starts of one worker, so a fast stack is not flooded on a shared machine; a worker whose
    request got no answer (the gateway is down) waits ``pause * 4`` before trying again.
    """

    def __init__(
        self, stack: FaultStack, *, workers: int = 2, pause: float = 0.05, label: str = "load"
    ) -> None:
        self.stack = stack
        self.workers = workers
        self.pause = pause
        self.label = label
        self.subject = f"subject-{uuid.uuid4().hex}"
        self.admitted: dict[str, str] = {}
        """Run id → the idempotency key of the start that was answered 2xx with it."""
        self.statuses: Counter[int] = Counter()
        self.codes: Counter[str] = Counter()
        """``<status> <problem code>`` of every answer that was not 2xx."""
        self.samples: list[httpx.Response] = []
        """One answer of each non-2xx ``<status> <code>``, as the client got it."""
        self.unanswered: Counter[str] = Counter()
        """Starts that got no answer, by the client's exception class."""
        self.errors: list[BaseException] = []
        self._attempted = 0
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- running

    def start(self) -> LoadDriver:
        """Begin starting runs."""
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._work, name=f"{self.label}-{n}", daemon=True)
            for n in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop starting runs; every start in flight ends first (answered or not)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=START_TIMEOUT_SECONDS * 3)
            if thread.is_alive():
                raise AssertionError(f"load worker {thread.name} did not stop")
        self._threads = []
        if self.errors:
            raise AssertionError(f"the load driver failed: {self.errors[0]!r}") from self.errors[0]

    def __enter__(self) -> LoadDriver:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=START_TIMEOUT_SECONDS * 3)

    def _work(self) -> None:
        url = f"{self.stack.local.url}/v1/workflows/{WORKFLOW_ID}/runs"
        token = self.stack.producer_token
        try:
            with httpx.Client(timeout=START_TIMEOUT_SECONDS) as client:
                while not self._stop.is_set():
                    began = time.monotonic()
                    answered = self._start_one(client, url, token)
                    rest = (self.pause if answered else self.pause * 4) - (time.monotonic() - began)
                    if rest > 0:
                        self._stop.wait(rest)
        except BaseException as exc:  # reported by stop(), not lost in the thread
            self.errors.append(exc)

    def _start_one(self, client: httpx.Client, url: str, token: str) -> bool:
        key = f"{self.label}-{next(self._keys)}-{uuid.uuid4().hex[:12]}"
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
        with self._lock:
            self._attempted += 1
        try:
            answer = client.post(url, json={"input": {"subjectRef": self.subject}}, headers=headers)
        except httpx.TransportError as exc:
            with self._lock:
                self.unanswered[type(exc).__name__] += 1
            return False
        with self._lock:
            self.statuses[answer.status_code] += 1
            if answer.is_success:
                self.admitted[str(answer.json()["runId"])] = key
                return True
            code = _problem_code(answer)
            shown = f"{answer.status_code} {code}"
            if self.codes[shown] < _SAMPLES_PER_CODE:
                self.samples.append(answer)
            self.codes[shown] += 1
        return True

    # ---- reading

    def figures(self) -> LoadFigures:
        """The counts so far."""
        with self._lock:
            return LoadFigures(
                self._attempted,
                len(self.admitted),
                dict(self.statuses),
                sum(self.unanswered.values()),
            )

    def admitted_ids(self) -> frozenset[str]:
        """The run ids of every start answered 2xx so far."""
        with self._lock:
            return frozenset(self.admitted)

    def wait_admitted(self, more: int, what: str, timeout: float = 60.0) -> None:
        """Wait until ``more`` further starts were answered 2xx."""
        target = self.figures().admitted + more
        wait_until(lambda: self.figures().admitted >= target, what, timeout=timeout)
        if self.errors:
            raise AssertionError(f"the load driver failed: {self.errors[0]!r}")


def _problem_code(answer: httpx.Response) -> str:
    try:
        document = answer.json()
    except ValueError:
        return "(no problem document)"
    code = document.get("code") if isinstance(document, dict) else None
    return str(code) if code else "(no code)"


def processed_total(stack: FaultStack) -> int:
    """How many commands the stand-in has processed, all keys together."""
    return sum(int(n) for n in stack.stats()["processed"].values())


def wait_flowing(stack: FaultStack, driver: LoadDriver, runs: int, what: str) -> None:
    """Wait until runs start and dispatch: ``runs`` more admitted and more processed."""
    before = processed_total(stack)
    driver.wait_admitted(runs, f"{what}: {runs} more runs admitted")
    wait_until(
        lambda: processed_total(stack) > before,
        f"{what}: the stand-in processing more commands",
        timeout=60.0,
    )


def stand_in_fault(stack: FaultStack) -> Any:
    """The stand-in's active fault (``None`` once a counted fault is used up)."""
    answer = httpx.get(stack.product_url + "/dev/faults", timeout=5.0)
    answer.raise_for_status()
    return answer.json()["fault"]


def hold_calls(stack: FaultStack, count: int, what: str) -> None:
    """Have the stand-in process the next ``count`` commands and hold their answers back;
    answers once that many were taken (each is processed, then held)."""
    stack.fault("hang-after", count=count)
    wait_until(lambda: stand_in_fault(stack) is None, f"{what}: {count} call(s) held")


def release_held(stack: FaultStack, count: int) -> None:
    """Let the stand-in answer the ``count`` held calls (one may reach its hold a moment
    after the fault took it, so this asks until all were let go)."""
    released = 0

    def all_released() -> bool:
        nonlocal released
        answer = httpx.post(stack.product_url + "/dev/faults/release", timeout=5.0)
        answer.raise_for_status()
        released += int(answer.json()["released"])
        return released >= count

    wait_until(all_released, f"{count} held call(s) answered", timeout=30.0)


# ---------------------------------------------------------------------------- the reading


def stored_runs(stack: FaultStack) -> list[dict[str, Any]]:
    """Every run in the database with its call step, read as the schema owner."""
    return stack.owner_fetch(
        "SELECT r.id, r.state, r.attention, s.state AS step_state, s.effect, s.cause,"
        " s.lease_owner, s.due_at, s.command_key"
        " FROM {ns}.run r LEFT JOIN {ns}.step s ON s.run_id = r.id AND s.step_id = $1",
        CALL_STEP,
    )


def unknown_steps(stack: FaultStack) -> dict[str, frozenset[str]]:
    """Run id → the steps whose effect the database records as unknown."""
    found: dict[str, set[str]] = {}
    rows = stack.owner_fetch("SELECT run_id, step_id FROM {ns}.step WHERE effect = 'unknown'")
    for row in rows:
        found.setdefault(str(row["run_id"]), set()).add(str(row["step_id"]))
    return {run: frozenset(steps) for run, steps in found.items()}


def api_run_ids(stack: FaultStack) -> frozenset[str]:
    """Every run the operator's list shows, following the cursor to its end."""
    ids: set[str] = set()
    cursor: str | None = None
    for _page in range(10_000):
        query = "?limit=100" + (f"&cursor={cursor}" if cursor else "")
        answer = stack.get("/v1/runs" + query)
        answer.raise_for_status()
        document = answer.json()
        ids.update(str(run["runId"]) for run in document["runs"])
        cursor = document.get("nextCursor")
        if not cursor:
            return frozenset(ids)
    raise AssertionError("the run list did not end")


def journal_path(stack: FaultStack) -> Path:
    """The deployment's audit journal (``auditFile`` beside the runtime file)."""
    return stack.local.runtime_file.parent / "audit.jsonl"


# ----------------------------------------------------------------------------- invariants


@dataclass(frozen=True)
class Shown:
    """What the API shows of one run: its status and, from inspection, the steps whose
    effect is unknown with their causes."""

    state: str
    attention: bool
    unknown: Mapping[str, str | None]
    """Step → cause, for each inspected step whose effect is ``unknown``."""


@dataclass(frozen=True)
class Observation:
    """Everything the invariants judge, read from a quiet stack (or made up by a test)."""

    admitted: frozenset[str]
    """Runs whose start was answered 2xx."""
    listed: frozenset[str]
    """Runs the API's list shows."""
    stored: Mapping[str, str]
    """Run id → state, for every run in the database (read as the schema owner)."""
    keys: Mapping[str, str]
    """Run id → the command key of its call step."""
    processed: Mapping[str, int]
    """Command key → times the stand-in processed it."""
    received: Mapping[str, int]
    """Command key → times a request with it reached the stand-in's ledger."""
    unknown: Mapping[str, frozenset[str]]
    """Run id → its steps whose effect the database records as unknown."""
    shown: Mapping[str, Shown]
    """Status and inspection of each held run and each run with an unknown effect."""
    journal: Path
    operator_resends: frozenset[str] = frozenset()
    """Runs an operator action of the test allowed to send again (retry-same)."""


@dataclass(frozen=True)
class Verdict:
    """The figures of an observation and the invariants it breaks."""

    figures: dict[str, int]
    violations: list[str] = field(default_factory=list)

    def assert_holds(self) -> None:
        """Fail with every broken invariant."""
        if self.violations:
            raise AssertionError(
                "invariants broken:\n  "
                + "\n  ".join(self.violations[:40])
                + (f"\n  … {len(self.violations) - 40} more" if len(self.violations) > 40 else "")
            )


def check_invariants(seen: Observation) -> Verdict:
    """Judge ``seen`` (see the module docstring for the invariants)."""
    violations: list[str] = []
    stored = set(seen.stored)
    for run in sorted(seen.admitted - stored):
        violations.append(f"lost: run {run} was admitted with a 2xx but is not in the database")
    for run in sorted(seen.admitted - seen.listed):
        violations.append(f"lost: run {run} was admitted with a 2xx but the API does not list it")

    runs_of = {key: run for run, key in seen.keys.items()}
    duplicated = resent = 0
    for key, count in sorted(seen.processed.items()):
        owner = runs_of.get(key)
        if owner is None:
            violations.append(f"orphan effect: command {key[:12]}… processed for no stored run")
        elif count > 1 and owner not in seen.operator_resends:
            duplicated += 1
            violations.append(f"duplicated: run {owner}'s command was processed {count} times")
    for key, count in sorted(seen.received.items()):
        owner = runs_of.get(key)
        if owner is not None and count > 1 and owner not in seen.operator_resends:
            resent += 1
            violations.append(f"resent: run {owner}'s command reached the product {count} times")

    held = sorted(run for run, state in seen.stored.items() if state == "held")
    for run in held:
        shown = seen.shown.get(run)
        if shown is None:
            violations.append(f"held without a reason: run {run} was not inspected")
            continue
        if shown.state != "held" or not shown.attention:
            violations.append(
                f"held without a reason: run {run} shows state {shown.state},"
                f" attention {shown.attention}"
            )
        if not any(cause for cause in shown.unknown.values()):
            violations.append(
                f"held without a reason: run {run}'s inspection shows no unknown effect with a"
                " cause"
            )
    for run, steps in sorted(seen.unknown.items()):
        shown = seen.shown.get(run)
        hidden = steps - set(shown.unknown if shown is not None else ())
        if hidden:
            violations.append(
                f"unknown effect not shown: run {run}, step(s) {', '.join(sorted(hidden))}"
            )

    result = verify_file(seen.journal)
    if not result.ok:
        violations.append(
            f"audit chain broken at line {result.line} of {seen.journal.name}: {result.reason}"
        )
    elif result.records == 0:
        violations.append("audit journal is empty")

    figures = {
        "admitted": len(seen.admitted),
        "stored": len(stored),
        "storedWithout2xx": len(stored - seen.admitted),
        "lost": len(seen.admitted - (stored & seen.listed)),
        "processed": sum(1 for n in seen.processed.values() if n),
        "duplicated": duplicated,
        "resent": resent,
        "held": len(held),
        "heldWithReason": sum(
            1
            for run in held
            if (shown := seen.shown.get(run)) is not None
            and shown.attention
            and any(shown.unknown.values())
        ),
        "unknownEffects": sum(len(steps) for steps in seen.unknown.values()),
        "unknownEffectsShown": sum(
            len(steps & set(seen.shown[run].unknown))
            for run, steps in seen.unknown.items()
            if run in seen.shown
        ),
        "succeeded": sum(1 for state in seen.stored.values() if state == "succeeded"),
        "auditRecords": result.records,
    }
    return Verdict(figures, violations)


def _shown(stack: FaultStack, run: str) -> Shown:
    status = stack.status(run)
    unknown: dict[str, str | None] = {}
    for step in stack.inspection(run)["steps"]:
        if step.get("effect") == "unknown":
            unknown[str(step["step"])] = step.get("cause")
    return Shown(str(status["state"]), bool(status["attention"]), unknown)


def observe(stack: FaultStack, admitted: Iterable[str]) -> Observation:
    """Read what the invariants judge from ``stack`` (which should be quiet: see
    :func:`settle`)."""
    rows = stored_runs(stack)
    stored = {str(row["id"]): str(row["state"]) for row in rows}
    unknown = unknown_steps(stack)
    stats = stack.stats()
    inspected = {run for run, state in stored.items() if state == "held"} | set(unknown)
    return Observation(
        admitted=frozenset(admitted),
        listed=api_run_ids(stack),
        stored=stored,
        keys={run: stack.key_of(run) for run in stored},
        processed={str(k): int(v) for k, v in stats["processed"].items()},
        received={str(k): int(v) for k, v in stats["received"].items()},
        unknown=unknown,
        shown={run: _shown(stack, run) for run in sorted(inspected)},
        journal=journal_path(stack),
    )


# ---------------------------------------------------------------------------- settling


def _movement(stack: FaultStack) -> tuple[Any, ...]:
    rows = stored_runs(stack)
    states = Counter((row["state"], row["step_state"]) for row in rows)
    stats = stack.stats()
    return (
        tuple(sorted(states.items(), key=str)),
        sum(stats["received"].values()),
        sum(stats["processed"].values()),
    )


def wait_quiet(stack: FaultStack, what: str) -> None:
    """Wait until neither the database's runs nor the stand-in's counts change for
    :data:`QUIET_SECONDS`."""
    last: tuple[Any, ...] | None = None
    since = time.monotonic()

    def quiet() -> bool:
        nonlocal last, since
        now = _movement(stack)
        if now != last:
            last, since = now, time.monotonic()
            return False
        return time.monotonic() - since >= QUIET_SECONDS

    wait_until(quiet, what, timeout=SETTLE_SECONDS)


def unsettled(stack: FaultStack) -> list[dict[str, Any]]:
    """The runs not (yet) ended or held, with their call step."""
    return [row for row in stored_runs(stack) if row["state"] not in SETTLED_STATES]


def settle(stack: FaultStack, driver: LoadDriver | None) -> None:
    """Stop the load, let the stack come to rest, move the clock past the lease, and wait
    until every run has ended or is held."""
    if driver is not None:
        driver.stop()
    wait_quiet(stack, "the stack at rest after the load")
    if unsettled(stack):
        # Steps left prepared or leased by a dispatcher that died or gave up while the
        # database was away: a lease later, the dispatcher finds them (§9.3 item 5).
        stack.advance(LEASE_SECONDS + 1)
    left: list[dict[str, Any]] = []

    def settled() -> bool:
        left[:] = unsettled(stack)
        return not left

    try:
        wait_until(settled, "every run ended or held", timeout=SETTLE_SECONDS)
    except RuntimeError as exc:
        raise AssertionError(f"{exc}; {len(left)} unsettled, e.g. {left[:5]}") from None


# ---------------------------------------------------------------------------- figures


def write_figures(family: str, figures: Mapping[str, Any]) -> Path:
    """Print the family's figures and keep them in ``.cache/reliability/<family>.json``."""
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{family}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"\n{family} figures: {json.dumps(figures, sort_keys=True)}")
    return path


# ---------------------------------------------------------------------------- broken variants


def tampered_copy(journal: Path, out: Path) -> Path:
    """A copy of ``journal`` with one byte changed in its first line (an ``at`` digit)."""
    lines = journal.read_bytes().splitlines(keepends=True)
    if len(lines) < 2:
        raise AssertionError("the journal needs two lines to tamper with one the next vouches for")
    first = lines[0]
    at = first.index(b'"at":"') + len(b'"at":"')
    digit = first[at : at + 1]
    lines[0] = first[:at] + (b"1" if digit != b"1" else b"2") + first[at + 1 :]
    out.write_bytes(b"".join(lines))
    return out


def broken_variants(seen: Observation, scratch: Path) -> dict[str, Observation]:
    """``seen`` broken in each way the checker must catch, by name of the broken invariant.

    The variants about a processed command need an admitted run whose command was processed,
    the ones about a held run a held run; a variant ``seen`` has nothing for is left out.
    """
    variants = {
        "lost": replace(seen, admitted=seen.admitted | {f"run-{uuid.uuid4().hex}"}),
        "audit chain broken": replace(seen, journal=tampered_copy(seen.journal, scratch)),
    }
    processed = [
        run for run in sorted(seen.admitted) if seen.processed.get(seen.keys.get(run, ""), 0)
    ]
    if processed:
        run = processed[0]
        key = seen.keys[run]
        variants["lost from the API"] = replace(seen, listed=seen.listed - {run})
        variants["duplicated"] = replace(seen, processed={**seen.processed, key: 2})
        variants["resent"] = replace(seen, received={**seen.received, key: 2})
    held = [run for run, state in sorted(seen.stored.items()) if state == "held"]
    if held:
        run = held[0]
        shown = seen.shown[run]
        variants["held without a reason"] = replace(
            seen, shown={**seen.shown, run: replace(shown, unknown={})}
        )
        variants["held without attention"] = replace(
            seen, shown={**seen.shown, run: replace(shown, attention=False)}
        )
        variants["held, not inspected"] = replace(
            seen, shown={k: v for k, v in seen.shown.items() if k != run}
        )
    return variants


EXPECTED_VIOLATION: Final = {
    "lost": "lost:",
    "lost from the API": "lost:",
    "duplicated": "duplicated:",
    "resent": "resent:",
    "held without a reason": "held without a reason:",
    "held without attention": "held without a reason:",
    "held, not inspected": "held without a reason:",
    "audit chain broken": "audit chain broken",
}
"""The start of the violation each broken variant must produce."""


def assert_broken_variants_fail(seen: Observation, scratch: Path) -> None:
    """The checker rejects ``seen`` once broken in each of the ways it must catch."""
    for name, broken in broken_variants(seen, scratch / "tampered.jsonl").items():
        violations = check_invariants(broken).violations
        assert any(v.startswith(EXPECTED_VIOLATION[name]) for v in violations), name


def assert_no_traceback(stack: FaultStack) -> None:
    """No coordinator process of the stack logged a traceback."""
    for name in stack.local.processes:
        if name.startswith("coordinator"):
            log = stack.local.log_text(name)
            assert "Traceback" not in log, (name, log[-4000:])


def keep_exposure(family: str, stack: FaultStack, driver: LoadDriver) -> None:
    """What the load showed and used, for the tier's secrets check."""
    for answer in driver.samples:
        EXPOSURE.keep_response(f"{family}/start-refused", answer)
    EXPOSURE.keep_secret(f"{family}/start-subject", driver.subject)
    EXPOSURE.keep_stack(family, stack)


def fabricated_observation(scratch: Path) -> Observation:
    """A small observation that holds, made up rather than read: one run that succeeded
    (its command processed once), one held with its unknown effect shown, and a
    three-line audit journal whose chain verifies."""
    journal = scratch / "audit.jsonl"
    prev = "0" * 64
    lines: list[bytes] = []
    for seq, action in enumerate(("audit-key.segment", "start", "start"), start=1):
        record: dict[str, Any] = {
            "seq": seq,
            "at": f"2026-05-01T09:00:0{seq}.000Z",
            "action": action,
            "outcome": "accepted",
            "principalRef": None,
            "clientRef": None,
            "prev": prev,
        }
        line = serialize(record)
        lines.append(line + b"\n")
        prev = line_hash(line)
    journal.write_bytes(b"".join(lines))
    done, held = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    keys = {done: f"key-{uuid.uuid4().hex}", held: f"key-{uuid.uuid4().hex}"}
    return Observation(
        admitted=frozenset({done, held}),
        listed=frozenset({done, held}),
        stored={done: "succeeded", held: "held"},
        keys=keys,
        processed={keys[done]: 1, keys[held]: 1},
        received={keys[done]: 1, keys[held]: 1},
        unknown={held: frozenset({CALL_STEP})},
        shown={held: Shown("held", True, {CALL_STEP: "lease-expired"})},
        journal=journal,
    )
