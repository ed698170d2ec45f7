"""One failing workflow per checker rule: each refusal has the right code and key path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import PackageInvalid
from core.workflow.check import check_source, check_source_dir

BASE: dict[str, Any] = {
    "format": "registry-coordinator/workflow/v1",
    "id": "sample",
    "version": "1.0.0",
    "input": {
        "type": "object",
        "additionalProperties": False,
        "required": ["caseRef", "who"],
        "properties": {
            "caseRef": {"type": "string"},
            "who": {"type": "string"},
            "count": {"type": "integer"},
            "plain": {"type": "string"},
            "when": {"type": "string", "format": "date-time"},
            "nested": {"type": "object", "properties": {"inner": {"type": "string"}}},
        },
    },
    "connections": {"review": "casework-review-producer", "notices": "messaging"},
    "outcomes": ["done", "expired"],
    "start": "ask",
    "steps": {
        "ask": {
            "call": {
                "connection": "review",
                "operation": "create-review-request",
                "input": {"subjectRef": "${input.caseRef}", "summary": "Case ${input.caseRef}"},
                "output": {"reviewId": "${response.reviewId}"},
            },
            "next": "wait",
        },
        "wait": {
            "wait-for": {
                "connection": "review",
                "result": "review-decision",
                "reviewId": "${steps.ask.reviewId}",
                "timeoutSeconds": 3600,
            },
            "next": "decide",
            "onTimeout": "expired",
        },
        "decide": {
            "choose": [
                {"when": {"equals": ["${steps.wait.outcome}", "approved"]}, "next": "notify"}
            ],
            "otherwise": "done",
        },
        "notify": {
            "call": {
                "connection": "notices",
                "operation": "send-notice",
                "input": {"template": "t", "recipientRef": "${input.who}", "parameters": {}},
                "output": {"messageId": "${response.messageId}"},
            },
            "next": "done",
        },
        "done": {"finish": {"outcome": "done"}},
        "expired": {"finish": {"outcome": "expired"}},
    },
}


def dump(document: dict[str, Any]) -> bytes:
    return yaml.safe_dump(document, sort_keys=False).encode()


def steps(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["steps"]  # type: ignore[no-any-return]


def notify_input(doc: dict[str, Any]) -> dict[str, Any]:
    return steps(doc)["notify"]["call"]["input"]  # type: ignore[no-any-return]


def _diamond(doc: dict[str, Any]) -> None:
    # decide -> notify | other; both -> final, which reads notify's output.
    s = steps(doc)
    s["notify"]["next"] = "final"
    s["decide"]["otherwise"] = "other"
    s["other"] = copy.deepcopy(s["notify"])
    s["final"] = copy.deepcopy(s["notify"])
    s["final"]["next"] = "done"
    s["final"]["call"]["input"]["parameters"] = {"id": "${steps.notify.messageId}"}


def _after_refusal(doc: dict[str, Any]) -> None:
    # notify's output does not exist when it was refused and the run went on at `fallback`.
    s = steps(doc)
    s["notify"]["onRefused"] = "fallback"
    s["fallback"] = copy.deepcopy(s["notify"])
    s["fallback"].pop("onRefused")
    s["fallback"]["call"]["input"]["parameters"] = {"id": "${steps.notify.messageId}"}


def _after_timeout(doc: dict[str, Any]) -> None:
    s = steps(doc)
    s["wait"]["onTimeout"] = "late"
    s["late"] = copy.deepcopy(s["notify"])
    s["late"]["next"] = "expired"
    s["late"]["call"]["input"]["parameters"] = {"o": "${steps.wait.outcome}"}


def _in_cancel_path(doc: dict[str, Any]) -> None:
    # A cancel can arrive before `ask` ran, so its path cannot read ask's values.
    doc["onCancel"] = "on-cancel"
    s = steps(doc)
    s["on-cancel"] = copy.deepcopy(s["notify"])
    s["on-cancel"]["call"]["input"]["parameters"] = {"r": "${steps.ask.reviewId}"}


def _too_many_steps(doc: dict[str, Any]) -> None:
    s = steps(doc)
    for n in range(60):
        s[f"extra-{n}"] = {"finish": {"outcome": "done"}}


def _wait_until(spec: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        steps(doc)["decide"]["otherwise"] = "pause"
        steps(doc)["pause"] = {"wait-until": spec, "next": "done"}

    return mutate


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node = doc
        for name in path[:-1]:
            node = node[name]
        node[path[-1]] = value

    return mutate


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node = doc
        for name in path[:-1]:
            node = node[name]
        del node[path[-1]]

    return mutate


def _param(value: Any) -> Callable[[dict[str, Any]], None]:
    return _set(("steps", "notify", "call", "input", "parameters"), {"x": value})


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown-top-key", _set(("colour",), "blue"), "colour", "not a key of a workflow"),
    (
        "unknown-call-key",
        _set(("steps", "ask", "call", "retries"), 3),
        "steps.ask.call.retries",
        "not a key of call",
    ),
    (
        "unknown-key-beside-step",
        _set(("steps", "ask", "onTimeout"), "done"),
        "steps.ask.onTimeout",
        "not a key of a call step",
    ),
    (
        "unknown-step-type",
        _set(("steps", "done"), {"stop": {"outcome": "done"}}),
        "steps.done.stop",
        "not a step type",
    ),
    ("two-step-types", _set(("steps", "done", "choose"), []), "steps.done.choose", "one type"),
    ("cycle", _set(("steps", "notify", "next"), "decide"), "steps.notify.next", "loop"),
    ("self-loop", _set(("steps", "notify", "next"), "notify"), "steps.notify.next", "loop"),
    (
        "unreachable-step",
        _set(("steps", "orphan"), {"finish": {"outcome": "done"}}),
        "steps.orphan",
        "never reached",
    ),
    ("path-without-finish", _drop(("steps", "notify", "next")), "steps.notify.next", "finish"),
    (
        "choose-without-otherwise",
        _drop(("steps", "decide", "otherwise")),
        "steps.decide.otherwise",
        "missing",
    ),
    (
        "outcome-not-listed",
        _set(("steps", "done", "finish", "outcome"), "finished"),
        "steps.done.finish.outcome",
        "not listed in outcomes",
    ),
    (
        "diamond-reference",
        _diamond,
        "steps.final.call.input.parameters.id",
        "does not run before this step on every path",
    ),
    (
        "reference-after-refusal",
        _after_refusal,
        "steps.fallback.call.input.parameters.id",
        "does not run before",
    ),
    (
        "reference-after-timeout",
        _after_timeout,
        "steps.late.call.input.parameters.o",
        "does not run before",
    ),
    (
        "reference-in-cancel-path",
        _in_cancel_path,
        "steps.on-cancel.call.input.parameters.r",
        "does not run before",
    ),
    (
        "reference-to-itself",
        _param("${steps.notify.messageId}"),
        "steps.notify.call.input.parameters.x",
        "does not run before",
    ),
    (
        "reference-to-unkept-field",
        _param("${steps.ask.caseId}"),
        "steps.notify.call.input.parameters.x",
        "keeps no field 'caseId'",
    ),
    (
        "reference-to-unkept-result-field",
        _param("${steps.wait.reviewer}"),
        "steps.notify.call.input.parameters.x",
        "keeps no field 'reviewer'",
    ),
    (
        "reference-to-step-keeping-nothing",
        _param("${steps.decide.x}"),
        "steps.notify.call.input.parameters.x",
        "keeps no values",
    ),
    (
        "reference-to-missing-step",
        _param("${steps.ghost.x}"),
        "steps.notify.call.input.parameters.x",
        "no step 'ghost'",
    ),
    (
        "undeclared-input-field",
        _set(("steps", "notify", "call", "input", "recipientRef"), "${input.recipient}"),
        "steps.notify.call.input.recipientRef",
        "declares no field 'recipient'",
    ),
    (
        "undeclared-nested-input-field",
        _param("${input.nested.outer}"),
        "steps.notify.call.input.parameters.x",
        "declares no field 'outer' in input.nested",
    ),
    (
        "input-field-of-a-string",
        _param("${input.who.first}"),
        "steps.notify.call.input.parameters.x",
        "has no field",
    ),
    (
        "unknown-expression-root",
        _param("${env.HOME}"),
        "steps.notify.call.input.parameters.x",
        "not an expression",
    ),
    ("unknown-run-field", _param("${run.owner}"), "steps.notify.call.input.parameters.x", "run.id"),
    (
        "unclosed-expression",
        _param("${input.who"),
        "steps.notify.call.input.parameters.x",
        "not closed",
    ),
    (
        "response-outside-output",
        _param("${response.messageId}"),
        "steps.notify.call.input.parameters.x",
        "only be used inside a call's output",
    ),
    (
        "output-reads-input",
        _set(("steps", "notify", "call", "output"), {"w": "${input.who}"}),
        "steps.notify.call.output.w",
        "only ${response.<field>}",
    ),
    (
        "output-unknown-response-field",
        _set(("steps", "notify", "call", "output"), {"w": "${response.bookingId}"}),
        "steps.notify.call.output.w",
        "has no field 'bookingId'",
    ),
    (
        "operation-unknown-for-type",
        _set(("steps", "notify", "call", "operation"), "book-slot"),
        "steps.notify.call.operation",
        "not an operation of messaging",
    ),
    (
        "operation-of-another-type",
        _set(("steps", "notify", "call", "operation"), "create-review-request"),
        "steps.notify.call.operation",
        "not an operation of messaging",
    ),
    (
        "missing-command-field",
        _drop(("steps", "notify", "call", "input", "template")),
        "steps.notify.call.input.template",
        "send-notice requires it",
    ),
    (
        "unknown-command-field",
        _set(("steps", "notify", "call", "input", "priority"), "high"),
        "steps.notify.call.input.priority",
        "not a field of send-notice",
    ),
    (
        "producer-written-by-author",
        _set(("steps", "ask", "call", "input", "producer"), "me"),
        "steps.ask.call.input.producer",
        "filled in by the coordinator",
    ),
    (
        "literal-of-wrong-type",
        _set(("steps", "notify", "call", "input", "parameters"), "x"),
        "steps.notify.call.input.parameters",
        "must be an object",
    ),
    (
        "number-for-string",
        _set(("steps", "notify", "call", "input", "template"), 7),
        "steps.notify.call.input.template",
        "must be a string",
    ),
    (
        "expression-of-wrong-type",
        _set(("steps", "notify", "call", "input", "recipientRef"), "${input.count}"),
        "steps.notify.call.input.recipientRef",
        "must be a string, but ${input.count} is an integer, as the input schema declares /count",
    ),
    (
        "misspelt-step",
        _set(("steps", "notify", "next"), "dnoe"),
        "steps.notify.next",
        "names no step 'dnoe'; did you mean 'done'?",
    ),
    (
        "connection-not-declared",
        _set(("steps", "notify", "call", "connection"), "mail"),
        "steps.notify.call.connection",
        "not declared under connections",
    ),
    (
        "unknown-connection-type",
        _set(("connections", "notices"), "email"),
        "connections.notices",
        "not a connection type",
    ),
    (
        "connection-unused",
        _set(("connections", "spare"), "scheduling"),
        "connections.spare",
        "no step uses it",
    ),
    (
        "wait-for-on-type-without-results",
        _set(("steps", "wait", "wait-for", "connection"), "notices"),
        "steps.wait.wait-for.result",
        "messaging connections have no result",
    ),
    (
        "wait-for-unknown-result",
        _set(("steps", "wait", "wait-for", "result"), "review-status"),
        "steps.wait.wait-for.result",
        "no result 'review-status'",
    ),
    (
        "wait-for-unknown-field",
        _set(("steps", "wait", "wait-for", "caseRef"), "x"),
        "steps.wait.wait-for.caseRef",
        "not a field of a wait-for on review-decision",
    ),
    (
        "wait-for-missing-identifier",
        _drop(("steps", "wait", "wait-for", "reviewId")),
        "steps.wait.wait-for.reviewId",
        "is missing",
    ),
    (
        "timeout-without-on-timeout",
        _drop(("steps", "wait", "onTimeout")),
        "steps.wait.onTimeout",
        "timeoutSeconds",
    ),
    (
        "on-timeout-without-timeout",
        _drop(("steps", "wait", "wait-for", "timeoutSeconds")),
        "steps.wait.onTimeout",
        "without wait-for.timeoutSeconds",
    ),
    (
        "next-names-unknown-step",
        _set(("steps", "ask", "next"), "nowhere"),
        "steps.ask.next",
        "no step 'nowhere'",
    ),
    (
        "on-refused-names-unknown-step",
        _set(("steps", "notify", "onRefused"), "nowhere"),
        "steps.notify.onRefused",
        "no step 'nowhere'",
    ),
    (
        "on-timeout-names-unknown-step",
        _set(("steps", "wait", "onTimeout"), "nowhere"),
        "steps.wait.onTimeout",
        "no step 'nowhere'",
    ),
    (
        "branch-names-unknown-step",
        _set(("steps", "decide", "choose", 0, "next"), "nowhere"),
        "steps.decide.choose[0].next",
        "no step 'nowhere'",
    ),
    (
        "on-cancel-names-unknown-step",
        _set(("onCancel",), "nowhere"),
        "onCancel",
        "no step 'nowhere'",
    ),
    ("start-names-unknown-step", _set(("start",), "nowhere"), "start", "no step 'nowhere'"),
    ("too-many-steps", _too_many_steps, "steps", "at most 64"),
    ("bad-workflow-id", _set(("id",), "Sample"), "id", "a-z"),
    ("bad-step-id", _set(("steps", "Done"), {"finish": {"outcome": "done"}}), "steps.Done", "a-z"),
    ("not-semantic-version", _set(("version",), "1.0"), "version", "semantic version"),
    (
        "wrong-format",
        _set(("format",), "registry-coordinator/workflow/v2"),
        "format",
        "registry-coordinator/workflow/v1",
    ),
    (
        "deadline-zero",
        _set(("steps", "ask", "call", "deadlineSeconds"), 0),
        "steps.ask.call.deadlineSeconds",
        "1 to 86,400",
    ),
    (
        "deadline-too-long",
        _set(("steps", "ask", "call", "deadlineSeconds"), 86_401),
        "steps.ask.call.deadlineSeconds",
        "1 to 86,400",
    ),
    (
        "after-seconds-too-long",
        _wait_until({"afterSeconds": 31_536_001}),
        "steps.pause.wait-until.afterSeconds",
        "31,536,000",
    ),
    (
        "wait-until-both",
        _wait_until({"afterSeconds": 5, "at": "2026-01-01T00:00:00Z"}),
        "steps.pause.wait-until",
        "exactly one of at",
    ),
    (
        "wait-until-bad-instant",
        _wait_until({"at": "tomorrow at nine"}),
        "steps.pause.wait-until.at",
        "RFC 3339",
    ),
    (
        "wait-until-non-instant-input",
        _wait_until({"at": "${input.plain}"}),
        "steps.pause.wait-until.at",
        "format: date-time",
    ),
    (
        "wait-until-integer-input",
        _wait_until({"at": "${input.count}"}),
        "steps.pause.wait-until.at",
        "not an instant",
    ),
    (
        "schema-without-additional-properties-false",
        _drop(("input", "additionalProperties")),
        "input.additionalProperties",
        "must be false at the top level",
    ),
    (
        "schema-unknown-keyword",
        _set(("input", "properties", "who", "oneOf"), []),
        "input.properties.who.oneOf",
        "not a supported schema keyword",
    ),
    (
        "schema-keyword-for-other-type",
        _set(("input", "properties", "count", "maxLength"), 3),
        "input.properties.count.maxLength",
        "applies to string",
    ),
    (
        "schema-required-undeclared",
        _set(("input", "required"), ["caseRef", "ghost"]),
        "input.required[1]",
        "not declared",
    ),
    (
        "unknown-predicate",
        _set(("steps", "decide", "choose", 0, "when"), {"matches": ["a", "b"]}),
        "steps.decide.choose[0].when.matches",
        "not a predicate",
    ),
    (
        "predicate-with-two-keys",
        _set(
            ("steps", "decide", "choose", 0, "when"), {"equals": [1, 1], "not": {"equals": [1, 2]}}
        ),
        "steps.decide.choose[0].when",
        "exactly one key",
    ),
    (
        "exists-without-reference",
        _set(("steps", "decide", "choose", 0, "when"), {"exists": "x"}),
        "steps.decide.choose[0].when.exists",
        "exactly one ${...}",
    ),
    (
        "equals-with-three-values",
        _set(("steps", "decide", "choose", 0, "when"), {"equals": [1, 2, 3]}),
        "steps.decide.choose[0].when.equals",
        "two values",
    ),
    (
        "reference-inside-nested-predicate",
        _set(
            ("steps", "decide", "choose", 0, "when"),
            {"any": [{"equals": [1, 1]}, {"not": {"exists": "${input.ghost}"}}]},
        ),
        "steps.decide.choose[0].when.any[1].not.exists",
        "declares no field 'ghost'",
    ),
    (
        "in-with-non-list",
        _set(
            ("steps", "decide", "choose", 0, "when"), {"in": ["${input.who}", "${input.caseRef}"]}
        ),
        "steps.decide.choose[0].when.in[1]",
        "must name a list",
    ),
    (
        "boolean-key",
        _set(("steps", "notify", "call", "input", "parameters"), {True: "x"}),
        "steps.notify.call.input.parameters.True",
        "keys must be text",
    ),
    (
        "unsafe-output-name",
        _set(("steps", "notify", "call", "output"), {"a.b": "${response.messageId}"}),
        "steps.notify.call.output.a.b",
        "kept value names",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_rule_refuses_with_code_and_path(
    mutate: Callable[[dict[str, Any]], None], path: str, reason: str
) -> None:
    document = copy.deepcopy(BASE)
    mutate(document)
    with pytest.raises(PackageInvalid) as caught:
        check_source(dump(document))
    assert caught.value.code == "package.invalid"
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_the_base_workflow_is_accepted() -> None:
    # Every refusal above is a single change to this document.
    workflow = check_source(dump(BASE))
    assert workflow.id == "sample"
    assert list(workflow.steps) == ["ask", "wait", "decide", "notify", "done", "expired"]


def test_a_reference_on_every_path_of_a_diamond_is_accepted() -> None:
    # The diamond's join may read `ask`, which precedes both arms.
    document = copy.deepcopy(BASE)
    _diamond(document)
    steps(document)["final"]["call"]["input"]["parameters"] = {"id": "${steps.ask.reviewId}"}
    assert "final" in check_source(dump(document)).steps


RAW_CASES = [
    ("anchor", "format: &f registry-coordinator/workflow/v1\n", "anchors"),
    ("alias", "a: 1\nb: *x\n", "aliases"),
    ("tag", "format: !!str registry-coordinator/workflow/v1\n", "tags"),
    ("custom-tag", "id: !secret sample\n", "tags"),
    ("two-documents", "id: a\n---\nid: b\n", "one YAML document"),
    ("not-a-mapping", "- just\n- a list\n", "mapping"),
    ("not-yaml", "id: [unclosed\n", "not valid YAML"),
    ("not-utf8", b"id: \xff\xfe\n", "UTF-8"),
]


@pytest.mark.parametrize(
    ("text", "reason"), [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES]
)
def test_yaml_outside_plain_data_is_refused(text: str | bytes, reason: str) -> None:
    source = text if isinstance(text, bytes) else text.encode()
    with pytest.raises(PackageInvalid) as caught:
        check_source(source)
    assert caught.value.code == "package.invalid"
    assert caught.value.path == "workflow.yaml"
    assert reason in caught.value.reason


def test_duplicate_keys_are_refused_at_their_path() -> None:
    text = (
        dump(BASE)
        .decode()
        .replace("  done:\n", "  done:\n    finish: {outcome: done}\n  done:\n", 1)
    )
    with pytest.raises(PackageInvalid) as caught:
        check_source(text.encode())
    assert caught.value.path == "steps.done"
    assert "duplicate" in caught.value.reason


def test_a_source_over_256_kib_is_refused(tmp_path: Path) -> None:
    padding = "# " + "x" * 1000 + "\n"
    source = dump(BASE) + (padding * 263).encode()
    assert len(source) > 256 * 1024
    with pytest.raises(PackageInvalid) as caught:
        check_source(source)
    assert (caught.value.code, caught.value.path) == ("package.invalid", "workflow.yaml")
    assert "256 KiB" in caught.value.reason
    (tmp_path / "workflow.yaml").write_bytes(source)
    with pytest.raises(PackageInvalid) as from_folder:
        check_source_dir(tmp_path)
    assert from_folder.value.path == "workflow.yaml"


def test_a_source_of_exactly_256_kib_is_accepted() -> None:
    source = dump(BASE)
    source += b"#" * (256 * 1024 - len(source) - 1) + b"\n"
    assert len(source) == 256 * 1024
    assert check_source(source).id == "sample"


def test_a_folder_without_workflow_yaml_is_refused(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("notes\n")
    with pytest.raises(PackageInvalid) as caught:
        check_source_dir(tmp_path)
    assert caught.value.path == str(tmp_path / "workflow.yaml")
    with pytest.raises(PackageInvalid) as not_a_folder:
        check_source_dir(tmp_path / "README.md")
    assert not_a_folder.value.path == str(tmp_path / "README.md")


def test_messages_never_quote_input_values() -> None:
    # A literal in the source may be sensitive; a refusal names the path, not the value.
    document = copy.deepcopy(BASE)
    notify_input(document)["template"] = 123456789
    with pytest.raises(PackageInvalid) as caught:
        check_source(dump(document))
    assert "123456789" not in str(caught.value)
