"""The code catalogue: complete against the contract, documented, the only way to build a
refusal, and intact across gRPC."""

from __future__ import annotations

import ast
import itertools
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from core.codes import PROBLEM_BASE, Code, update_markdown
from core.errors import ConfigInvalid, CoordinatorError, PackageInvalid
from core.rpc.errors import rebuild, refusals, status_for

ROOT = Path(__file__).resolve().parents[2]
API_REFERENCE = ROOT / "docs" / "api.md"
PRODUCT = ("admission", "auditd", "cli", "core", "devstack", "dispatcher", "gateway", "recovery")

# CONTRACT §15: HTTP problem codes and their status.
CONTRACT_HTTP = {
    "service.unavailable": 503,
    "audit.response-unavailable": 503,
    "deployment.refused": 409,
    "deployment.activation-changed": 409,
    "binding.conflict": 409,
    "binding.live-conflict": 409,
    "execution.held": 409,
    "admission.held": 409,
    "admission.recovery-only": 409,
    "restore.hold-required": 409,
    "restore.unresolved": 409,
    "restore.review-required": 409,
    "restore.lease-incompatible": 409,
    "reconcile.unsupported": 409,
    "reconcile.refused": 409,
    "reconcile.raced": 409,
    "retry.refused": 409,
    "receipt.expired": 409,
    "run.payload-erased": 409,
    "cancel.refused": 409,
    "start.conflict": 409,
    "authentication.refused": 401,
    "authorization.refused": 403,
    "run.not-found": 404,
    "workflow.not-found": 404,
    "input.invalid": 422,
    "request.invalid": 400,
    "request.too-large": 413,
    "not-found": 404,
    "method-not-allowed": 405,
}
# CONTRACT §2.2: the codes coordinatorctl itself uses.
CONTRACT_CLI = (
    "coordinator.config.invalid",
    "coordinator.package.invalid",
    "coordinator.package.digest-mismatch",
    "coordinator.deployment.refused",
    "coordinator.deployment.workflow-unlisted",
    "coordinator.deployment.workflow-live-runs",
    "coordinator.deployment.schema-too-old",
    "coordinator.command.state-key-custody",
    "coordinator.command.live-binding-conflict",
    "coordinator.store.unavailable",
    "coordinator.auth.token-file",
)
# CONTRACT §2.1, §15: raw codes on the service's standard error.
CONTRACT_RAW = {
    "store-unavailable": Code.STORE_UNAVAILABLE,
    "deployment.refused": Code.DEPLOYMENT_REFUSED,
    "state-key-custody": Code.STATE_KEY_CUSTODY,
    "live-binding-conflict": Code.LIVE_BINDING_CONFLICT,
}


# ----------------------------------------------------------------------------- the contract


def test_http_codes_are_the_contracts_with_their_status() -> None:
    http = {code.value: code.status for code in Code if code.status is not None}
    # ``internal`` is the bare 500 of an unexpected failure, not a contract code.
    assert http == {**CONTRACT_HTTP, "internal": 500}


def test_every_cli_code_of_the_contract_exists() -> None:
    for spelled in CONTRACT_CLI:
        assert Code.parse(spelled.removeprefix("coordinator.")) is not None, spelled


def test_raw_spellings_are_the_contracts() -> None:
    assert {code.raw: code for code in Code if code.raw is not None} == CONTRACT_RAW


def test_every_code_is_described() -> None:
    for code in Code:
        info = code.info
        assert info.title and info.meaning and info.action, code
        # Advice for coordinatorctl is only needed where an HTTP code has a second meaning.
        assert info.cli is None or code.status is not None, code
        assert not (info.log_only and code.status is not None), code


def test_problem_type_uri() -> None:
    assert Code.EXECUTION_HELD.type_uri == PROBLEM_BASE + "execution.held"


def test_error_subclasses_carry_their_codes() -> None:
    assert ConfigInvalid("deployment.namespace", "is missing").code is Code.CONFIG_INVALID
    assert PackageInvalid("workflow.yaml", "is empty").code is Code.PACKAGE_INVALID
    mismatch = PackageInvalid("manifest.json", "differs", Code.PACKAGE_DIGEST_MISMATCH)
    assert mismatch.cli_line() == "coordinator.package.digest-mismatch: manifest.json: differs"


# ----------------------------------------------------------------------------- the API reference


def test_api_reference_tables_are_generated_from_the_catalogue() -> None:
    text = API_REFERENCE.read_text()
    assert update_markdown(text) == text, "run: python -m core.codes --update docs/api.md"


def test_api_reference_lists_every_code() -> None:
    text = API_REFERENCE.read_text().split("## HTTP problem codes", 1)[1]
    documented = set(re.findall(r"^\| `(?:coordinator\.)?([a-z.-]+)` \|", text, re.MULTILINE))
    assert documented == {code.value for code in Code}
    http_rows = set(re.findall(r"^\| `([a-z.-]+)` \| (\d{3}) \|", text, flags=re.MULTILINE))
    assert http_rows == {(code.value, str(code.status)) for code in Code if code.status}


def test_api_reference_names_every_raw_code() -> None:
    section = API_REFERENCE.read_text().split("## Raw codes of the service", 1)[1]
    for raw in CONTRACT_RAW:
        assert f"`{raw}`" in section, raw


# ----------------------------------------------------------------------------- the source


def _product_files() -> Iterator[Path]:
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "_pb2" not in path.name:
                yield path


def _error_classes(modules: list[ast.Module]) -> tuple[dict[str, int | None], dict[str, str]]:
    """Each CoordinatorError class -> index of its ``code`` parameter (None: takes none),
    and each subclass -> its error base (for ``super().__init__``)."""
    positions: dict[str, int | None] = {"CoordinatorError": 0}
    parents: dict[str, str] = {}
    classes = [node for module in modules for node in ast.walk(module)]
    found = True
    while found:
        found = False
        for node in classes:
            if not isinstance(node, ast.ClassDef) or node.name in positions:
                continue
            bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in positions]
            if not bases:
                continue
            parents[node.name] = bases[0]
            positions[node.name] = positions[bases[0]]
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    params = [a.arg for a in item.args.args][1:]
                    positions[node.name] = params.index("code") if "code" in params else None
            found = True
    return positions, parents


def _enclosing_class(module: ast.Module) -> dict[ast.AST, str]:
    owner: dict[ast.AST, str] = {}
    for cls in ast.walk(module):
        if isinstance(cls, ast.ClassDef):
            # Inner classes come later in the walk and win, as they should.
            owner.update({node: cls.name for node in ast.walk(cls) if node is not cls})
    return owner


def _code_arguments(
    module: ast.Module, positions: dict[str, int | None], parents: dict[str, str]
) -> Iterator[ast.expr]:
    """Every expression passed as the code of an error constructor or ``super().__init__``."""
    owner = _enclosing_class(module)
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            name: str | None = func.id
        elif isinstance(func, ast.Attribute):
            is_super = isinstance(func.value, ast.Call) and (
                isinstance(func.value.func, ast.Name) and func.value.func.id == "super"
            )
            name = parents.get(owner.get(node, "")) if is_super else func.attr
        else:
            continue
        if name not in positions:
            continue
        position = positions[name]
        if position is not None and position < len(node.args):
            yield node.args[position]
        yield from (k.value for k in node.keywords if k.arg == "code")


def _module_names(module: ast.Module) -> set[str]:
    """Names bound at module level by an assignment or an import."""
    names = set()
    for stmt in module.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(stmt, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in stmt.names}
    return names


def _is_code_member(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Code"
    )


def _allowed_code_argument(node: ast.expr, module_names: set[str]) -> bool:
    """``Code.X``, a variable or parameter (mypy checks that it is a Code), or another
    error's ``.code``; never a literal, a computed string or a module constant."""
    if _is_code_member(node):
        return True
    if isinstance(node, ast.Name):
        return node.id not in module_names
    return isinstance(node, ast.Attribute) and node.attr == "code"


def _string_comparisons(module: ast.Module) -> Iterator[ast.Compare]:
    """Comparisons of some ``<expr>.code`` with a string literal."""

    def is_code(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "code"

    def is_text(node: ast.expr) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(is_text(element) for element in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    for node in ast.walk(module):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for left, right in itertools.pairwise(operands):
                if (is_code(left) and is_text(right)) or (is_code(right) and is_text(left)):
                    yield node


def test_no_refusal_is_built_from_a_string() -> None:
    # Fails until convert_codes.py (issue 10) has run over every component's files.
    parsed = {path: ast.parse(path.read_text()) for path in _product_files()}
    positions, parents = _error_classes(list(parsed.values()))
    assert {"ConfigInvalid", "PackageInvalid", "SecretError"} <= positions.keys()
    offences = []
    for path, module in parsed.items():
        where = path.relative_to(ROOT)
        module_names = _module_names(module)
        for argument in _code_arguments(module, positions, parents):
            if not _allowed_code_argument(argument, module_names):
                offences.append(f"{where}:{argument.lineno}: code {ast.unparse(argument)}")
        for compare in _string_comparisons(module):
            offences.append(f"{where}:{compare.lineno}: {ast.unparse(compare)}")
    assert offences == []


def test_every_code_used_in_the_source_is_catalogued() -> None:
    used = set()
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_code_member(node):
                used.add(node.attr)
    members = {code.name for code in Code}
    assert used - members - {"parse"} == set()


# ----------------------------------------------------------------------------- gRPC


class _Context:
    """What ``refusals`` uses of a servicer context."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.status: grpc.StatusCode | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, status: grpc.StatusCode, details: str) -> None:
        self.status = status


async def _across(error: CoordinatorError) -> tuple[CoordinatorError, grpc.StatusCode | None]:
    @refusals
    async def method(self: Any, request: Any, context: Any) -> None:
        raise error

    context = _Context()
    await method(None, None, context)
    failure = grpc.aio.AioRpcError(
        context.status or grpc.StatusCode.UNKNOWN,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*context.trailing),
    )
    return rebuild(failure, "recovery"), context.status


@pytest.mark.parametrize("code", list(Code))
async def test_a_refusal_crosses_grpc_with_its_code(code: Code) -> None:
    sent = CoordinatorError(code, "what went wrong", {"errors": ["/name"]})
    received, status = await _across(sent)
    assert received.code is code
    assert (received.detail, received.extra) == ("what went wrong", {"errors": ["/name"]})
    assert status is status_for(code)


def test_grpc_status_follows_the_http_status() -> None:
    assert status_for(Code.RUN_NOT_FOUND) is grpc.StatusCode.NOT_FOUND
    assert status_for(Code.EXECUTION_HELD) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(Code.SERVICE_UNAVAILABLE) is grpc.StatusCode.UNAVAILABLE
    assert status_for(Code.CONFIG_INVALID) is grpc.StatusCode.INTERNAL


def test_an_unknown_code_arrives_as_internal_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failure = grpc.aio.AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("coordinator-code", "newer.code"), ("coordinator-detail", "d")),
    )
    with caplog.at_level(logging.ERROR, logger="coordinator.rpc"):
        received = rebuild(failure, "admission")
    assert received.code is Code.INTERNAL
    assert any("newer.code" in record.getMessage() for record in caplog.records)


def test_a_lost_component_is_service_unavailable() -> None:
    failure = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()
    )
    assert rebuild(failure, "auditd").code is Code.SERVICE_UNAVAILABLE
