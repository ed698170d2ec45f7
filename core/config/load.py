"""Read a runtime file into :class:`core.config.model.RuntimeConfig` (CONTRACT §5).

Loading refuses, naming the dotted key path: YAML that is not strict plain data, unknown or
missing keys, wrong types, values out of bounds, and every rule that can be judged from the
file alone. The rules that need the packages (workflow ids, required connections) are in
:mod:`core.config.check`. Nothing here opens a secret or contacts the network.

A file that is not strict YAML is refused at once. Otherwise every block and member is judged
and each refusal kept (:class:`core.yamlsafe.Problems`), in file order, so the first is the
one a single-line surface shows. A rule that needs a value refused earlier (``activeStateKey``
against refused ``stateKeys``) is skipped rather than reported as a second problem.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from core import yamlsafe
from core.actions import DEPLOYMENT_ACTIONS, RUN_ACTIONS
from core.config import reader as r
from core.config.connections import check_name, read_connections
from core.config.context import Context, Loaded
from core.config.model import (
    ASSERTION_AUDIENCE_TOKEN_ENDPOINT,
    CLIENT_ASSERTION_AUDIENCES,
    DEFAULT_ALGORITHMS,
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_MAX_CONNECTIONS,
    INTERNAL_COMPONENTS,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_CONNECTIONS_LIMIT,
    MAX_HEADER_TIMEOUT_SECONDS,
    MAX_RETRYING_AFTER_SECONDS,
    MIN_RETRYING_AFTER_SECONDS,
    REQUIRED_INTERNAL_COMPONENTS,
    TLS_TERMINATION,
    Attention,
    Authentication,
    BindAddress,
    DatabaseSettings,
    Deployment,
    EventSource,
    FileProvider,
    Internal,
    InternalTls,
    Listener,
    Logging,
    MetricsListener,
    PackagePin,
    Policy,
    RuntimeConfig,
    SecretProviders,
    SigningKeys,
    StateKey,
)
from core.errors import ConfigInvalid
from core.paths import index, key
from core.secrets import SecretRef
from core.yamlsafe import FAILED, AlreadyReported, Maybe, Problems, need, need_all

MAX_FILE_BYTES = 1024 * 1024
MAX_PACKAGES = 16
SUPPORTED_ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip

NAMESPACE = re.compile(r"coordinator_[a-z0-9_]+")
NAMESPACE_MAX_BYTES = 63
# A Unix socket path holds at most 107 bytes; the longest name placed in the folder is
# "/dispatcher.sock" (16 bytes).
SOCKET_DIR_MAX_BYTES = 107 - len("/dispatcher.sock")
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
WORKFLOW_ID = re.compile(r"[a-z][a-z0-9-]{0,62}")


@dataclass
class Reading:
    """One reading of a runtime file: the record (FAILED when anything was refused), what
    loaded of it, and every refusal found."""

    config: Maybe[RuntimeConfig]
    loaded: Loaded
    problems: Problems


def load_runtime_file(path: Path) -> RuntimeConfig:
    """Read and check a runtime file; relative paths in it are taken from its folder.

    Refuses with the first problem; it carries every problem found (``extra["problems"]``).
    """
    reading = read_runtime_file(path)
    reading.problems.raise_first()
    return need(reading.config)


def read_runtime_file(path: Path) -> Reading:
    """Read a runtime file, keeping every refusal instead of raising the first.

    Raises only when the file cannot be read or is not strict YAML: then nothing in it can
    be judged.
    """
    location = Path(os.path.abspath(path))
    try:
        with open(location, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        raise ConfigInvalid("", f"cannot read the runtime file {location}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigInvalid("", f"the runtime file {location} is larger than 1 MiB")
    document, marks = yamlsafe.load_marked(data, ConfigInvalid)
    return read_runtime(document, location, Problems(marks))


def parse_runtime(document: object, location: Path) -> RuntimeConfig:
    """Turn the loaded YAML document of the runtime file at ``location`` into a record."""
    reading = read_runtime(document, location, Problems())
    reading.problems.raise_first()
    return need(reading.config)


def read_runtime(document: object, location: Path, problems: Problems) -> Reading:
    """Judge a loaded runtime document, keeping every refusal in ``problems``."""
    context = Context(problems=problems, loaded=Loaded(), base=location.parent)
    config = problems.attempt(_runtime, document, location, context)
    if config is FAILED and not problems:
        raise AssertionError("a reader gave up without reporting why")
    return Reading(config=config, loaded=context.loaded, problems=problems)


def _runtime(document: object, location: Path, context: Context) -> RuntimeConfig:
    if document is None:
        raise ConfigInvalid("", "the runtime file is empty")
    top = r.mapping(
        document,
        "",
        context.problems,
        required=("namespace", "secretProviders", "database", "deployment"),
        optional=("eventSources", "connections"),
    )
    namespace = top.read("namespace", _namespace)
    providers = top.read("secretProviders", _providers, context.base, context.problems)
    context.providers = None if providers is FAILED else providers
    database = top.read("database", _database, context)
    event_sources = top.optional("eventSources", {}, _event_sources, context)
    deployment = top.read("deployment", _deployment, context)
    connections = top.optional("connections", {}, read_connections, context)
    return RuntimeConfig(
        path=location,
        namespace=need(namespace),
        secret_providers=need(providers),
        database=need(database),
        event_sources=need(event_sources),
        deployment=need(deployment),
        connections=need(connections),
    )


def _namespace(value: object, path: str) -> str:
    text = r.string(
        value,
        path,
        pattern=NAMESPACE,
        expected="coordinator_ followed by lowercase letters, digits or _",
        max_bytes=1024,
    )
    if len(text.encode("utf-8")) > NAMESPACE_MAX_BYTES:
        raise ConfigInvalid(path, f"must be at most {NAMESPACE_MAX_BYTES} bytes")
    return text


def _providers(value: object, path: str, base: Path, problems: Problems) -> SecretProviders:
    block = r.mapping(value, path, problems, optional=("file", "environment"))
    file_provider = block.optional("file", None, _file_provider, base, problems)
    environment = "environment" in block
    if environment:
        # The block has no settings today; it exists so that enabling it is explicit.
        block.read("environment", _empty_block, problems)
    return SecretProviders(file=need(file_provider), environment=environment)


def _file_provider(value: object, path: str, base: Path, problems: Problems) -> FileProvider:
    block = r.mapping(value, path, problems, required=("root",))
    return FileProvider(root=need(block.read("root", r.local_path, base)))


def _empty_block(value: object, path: str, problems: Problems) -> None:
    r.mapping(value, path, problems)


def _database(value: object, path: str, context: Context) -> DatabaseSettings:
    block = r.mapping(
        value,
        path,
        context.problems,
        required=("runtimeUrlRef", "migrationUrlRef"),
        optional=("trustedRootCertificateRef",),
    )
    runtime_url = block.read("runtimeUrlRef", r.reference, context.providers)
    migration_url = block.read("migrationUrlRef", r.reference, context.providers)
    root_ref: Maybe[SecretRef | None] = None
    # An explicit null stands for "absent" here, as it always has.
    if block.values.get("trustedRootCertificateRef") is not None:
        root_ref = block.read("trustedRootCertificateRef", r.reference, context.providers)
    return DatabaseSettings(
        runtime_url_ref=need(runtime_url),
        migration_url_ref=need(migration_url),
        trusted_root_certificate_ref=need(root_ref),
    )


def _event_sources(value: object, path: str, context: Context) -> dict[str, EventSource]:
    entries = r.named_entries(value, path)
    result: dict[str, Maybe[EventSource]] = {}
    first_by_source: dict[str, str] = {}
    for name, entry in entries.items():
        read = context.problems.attempt(
            _event_source, name, entry, key(path, name), context, first_by_source
        )
        if read is not FAILED:
            context.loaded.event_sources[name] = read
        result[name] = read
    return dict(zip(result, need_all(result.values()), strict=True))


def _event_source(
    name: str, value: object, path: str, context: Context, first_by_source: dict[str, str]
) -> EventSource:
    problems = context.problems
    problems.attempt(check_name, name, path)
    block = r.mapping(value, path, problems, required=("source", "signingKeyRef", "workflow"))
    source = block.read("source", r.visible, max_len=2048)
    if source is not FAILED:
        if source in first_by_source:
            problems.add(
                ConfigInvalid(
                    key(path, "source"),
                    f"the same source as eventSources.{first_by_source[source]}; "
                    "sources must be unique",
                )
            )
            source = FAILED
        else:
            first_by_source[source] = name
    signing_key = block.read("signingKeyRef", r.reference, context.providers)
    workflow = block.read("workflow", _workflow_id)
    return EventSource(
        name=name,
        source=need(source),
        signing_key_ref=need(signing_key),
        workflow=need(workflow),
    )


def _deployment(value: object, path: str, context: Context) -> Deployment:
    block = r.mapping(
        value,
        path,
        context.problems,
        required=(
            "databaseId",
            "runtimeRole",
            "packages",
            "listener",
            "authentication",
            "auditFile",
            "auditKeyRef",
            "stateKeys",
            "activeStateKey",
            "admissionKeyRef",
        ),
        optional=("metricsListener", "internal", "logging", "attention"),
    )
    database_id = block.read("databaseId", _database_id)
    runtime_role = block.read(
        "runtimeRole",
        r.string,
        pattern=ROLE,
        expected="a PostgreSQL role name: a lowercase letter or _, then up to 62 of a-z 0-9 _",
    )
    packages = block.read("packages", _packages, context)
    listener = block.read("listener", _listener, context.problems)
    metrics = block.optional("metricsListener", None, _metrics_listener, context, listener)
    internal = block.optional("internal", None, _internal, context)
    authentication = block.read("authentication", _authentication, context)
    audit_file = block.read("auditFile", r.local_path, context.base)
    audit_key_ref = block.read("auditKeyRef", r.reference, context.providers)
    state_keys = block.read("stateKeys", _state_keys, context)
    active = block.read("activeStateKey", r.integer, low=1, high=2**31 - 1)
    if (
        active is not FAILED
        and state_keys is not FAILED
        and active not in {state_key.version for state_key in state_keys}
    ):
        context.problems.add(
            ConfigInvalid(key(path, "activeStateKey"), "names no version listed in stateKeys")
        )
        active = FAILED
    admission_key_ref = block.read("admissionKeyRef", r.reference, context.providers)
    logging = block.optional("logging", Logging(), _logging, context.problems)
    attention = block.optional("attention", Attention(), _attention, context.problems)
    return Deployment(
        database_id=need(database_id),
        runtime_role=need(runtime_role),
        packages=need(packages),
        listener=need(listener),
        metrics_listener=need(metrics),
        internal=need(internal),
        authentication=need(authentication),
        audit_file=need(audit_file),
        audit_key_ref=need(audit_key_ref),
        state_keys=need(state_keys),
        active_state_key=need(active),
        admission_key_ref=need(admission_key_ref),
        logging=need(logging),
        attention=need(attention),
    )


def _database_id(value: object, path: str) -> str:
    return r.string(
        value, path, pattern=UUID, expected="a UUID (8-4-4-4-12 hexadecimal digits)"
    ).lower()


def _logging(value: object, path: str, problems: Problems) -> Logging:
    block = r.mapping(value, path, problems, optional=("level", "format"))
    settings = Logging()
    level = block.optional("level", settings.level, _one_of, LOG_LEVELS)
    form = block.optional("format", settings.format, _one_of, LOG_FORMATS)
    return Logging(level=need(level), format=need(form))


def _attention(value: object, path: str, problems: Problems) -> Attention:
    block = r.mapping(value, path, problems, optional=("retryingAfterSeconds",))
    settings = Attention()
    retrying = block.optional(
        "retryingAfterSeconds",
        settings.retrying_after_seconds,
        r.integer,
        low=MIN_RETRYING_AFTER_SECONDS,
        high=MAX_RETRYING_AFTER_SECONDS,
    )
    return Attention(retrying_after_seconds=need(retrying))


def _one_of(value: object, path: str, choices: tuple[str, ...]) -> str:
    text = r.string(value, path)
    if text not in choices:
        raise ConfigInvalid(path, f"must be one of {', '.join(choices)}")
    return text


def _packages(value: object, path: str, context: Context) -> tuple[PackagePin, ...]:
    entries = r.sequence(value, path, min_items=1, max_items=MAX_PACKAGES)
    pins = tuple(
        need_all(
            context.problems.attempt(_pin, entry, index(path, position), context)
            for position, entry in enumerate(entries)
        )
    )
    context.loaded.pins = pins
    return pins


def _pin(value: object, path: str, context: Context) -> PackagePin:
    block = r.mapping(value, path, context.problems, required=("root", "expectedDigest"))
    root = block.read("root", r.local_path, context.base)
    digest = block.read(
        "expectedDigest",
        r.string,
        pattern=DIGEST,
        expected="sha256: followed by 64 lowercase hexadecimal digits",
    )
    return PackagePin(root=need(root), expected_digest=need(digest))


def _listener(value: object, path: str, problems: Problems) -> Listener:
    block = r.mapping(
        value,
        path,
        problems,
        required=("bind", "tlsTermination"),
        optional=("publicUrl", "maxConnections", "headerTimeoutSeconds"),
    )
    termination = block.read("tlsTermination", _tls_termination)
    public_url = block.optional("publicUrl", None, r.url)
    bind = block.read("bind", r.bind)
    max_connections = block.optional(
        "maxConnections", DEFAULT_MAX_CONNECTIONS, r.integer, low=1, high=MAX_CONNECTIONS_LIMIT
    )
    header_timeout = block.optional(
        "headerTimeoutSeconds",
        DEFAULT_HEADER_TIMEOUT_SECONDS,
        r.integer,
        low=1,
        high=MAX_HEADER_TIMEOUT_SECONDS,
    )
    return Listener(
        bind=need(bind),
        tls_termination=need(termination),
        public_url=need(public_url),
        max_connections=need(max_connections),
        header_timeout_seconds=need(header_timeout),
    )


def _tls_termination(value: object, path: str) -> str:
    termination = r.string(value, path)
    if termination != TLS_TERMINATION:
        raise ConfigInvalid(path, f"must be {TLS_TERMINATION}")
    return termination


def _metrics_listener(
    value: object, path: str, context: Context, listener: Maybe[Listener]
) -> MetricsListener:
    block = r.mapping(value, path, context.problems, required=("bind",))
    bind = need(block.read("bind", r.bind))
    if listener is not FAILED and _same_socket(bind, listener.bind):
        raise ConfigInvalid(key(path, "bind"), "must differ from deployment.listener.bind")
    return MetricsListener(bind=bind)


def _same_socket(one: BindAddress, other: BindAddress) -> bool:
    return one.port == other.port and one.address == other.address


def _internal(value: object, path: str, context: Context) -> Internal:
    problems = context.problems
    block = r.mapping(
        value, path, problems, optional=("socketDir", "addresses", "tls", "metricsPort")
    )
    if "socketDir" in block and "addresses" in block:
        raise ConfigInvalid(key(path, "addresses"), "use either socketDir or addresses, not both")
    if "socketDir" in block:
        for extra in ("tls", "metricsPort"):
            if extra in block:
                problems.add(ConfigInvalid(key(path, extra), "only used with addresses"))
        socket_dir = need(block.read("socketDir", _socket_dir, context.base))
        if "tls" in block or "metricsPort" in block:
            raise AlreadyReported
        return Internal(socket_dir=socket_dir, addresses={}, tls=None)
    if "addresses" not in block:
        raise ConfigInvalid(path, "needs socketDir or addresses")
    if "tls" not in block:
        problems.add(ConfigInvalid(key(path, "tls"), "required with addresses (mutual TLS)"))
    addresses = block.read("addresses", _addresses, problems)
    tls = block.read("tls", _internal_tls, context)
    metrics_port = block.optional("metricsPort", None, r.integer, low=1, high=65535)
    if metrics_port not in (None, FAILED) and addresses is not FAILED:
        problem = _metrics_port_problem(metrics_port, addresses)
        if problem:
            problems.add(ConfigInvalid(key(path, "metricsPort"), problem))
            metrics_port = FAILED
    return Internal(
        socket_dir=None, addresses=need(addresses), tls=need(tls), metrics_port=need(metrics_port)
    )


def _metrics_port_problem(port: int, addresses: dict[str, BindAddress]) -> str | None:
    # Each component listens on its own host's port: two on one host would collide there,
    # and a gRPC port of the same number would be taken already.
    hosts: dict[str, str] = {}
    for component, address in addresses.items():
        if address.port == port:
            return f"is {component}'s gRPC port"
        if address.host in hosts:
            return (
                f"needs each component on its own host, but {hosts[address.host]} and "
                f"{component} share {address.host}"
            )
        hosts[address.host] = component
    return None


def _socket_dir(value: object, path: str, base: Path) -> Path:
    socket_dir = r.local_path(value, path, base)
    if len(str(socket_dir).encode()) > SOCKET_DIR_MAX_BYTES:
        raise ConfigInvalid(
            path,
            f"must be at most {SOCKET_DIR_MAX_BYTES} bytes once resolved, so that the "
            "components' Unix socket paths fit the system's limit",
        )
    return socket_dir


def _addresses(value: object, path: str, problems: Problems) -> dict[str, BindAddress]:
    entries = r.mapping(
        value,
        path,
        problems,
        required=REQUIRED_INTERNAL_COMPONENTS,
        optional=tuple(c for c in INTERNAL_COMPONENTS if c not in REQUIRED_INTERNAL_COMPONENTS),
    )
    addresses: dict[str, Maybe[BindAddress]] = {}
    for component, _entry in entries.items():
        address = entries.read(component, r.bind)
        if address is not FAILED:
            for other, taken in addresses.items():
                if taken is not FAILED and _same_socket(address, taken):
                    problems.add(
                        ConfigInvalid(key(path, component), f"the same address as {other}")
                    )
                    address = FAILED
                    break
        addresses[component] = address
    if any(name not in entries for name in REQUIRED_INTERNAL_COMPONENTS):
        raise AlreadyReported
    return dict(zip(addresses, need_all(addresses.values()), strict=True))


def _internal_tls(value: object, path: str, context: Context) -> InternalTls:
    block = r.mapping(
        value,
        path,
        context.problems,
        required=("certificateRef", "privateKeyRef", "trustedRootCertificateRef"),
    )
    certificate = block.read("certificateRef", r.reference, context.providers)
    private_key = block.read("privateKeyRef", r.reference, context.providers)
    root = block.read("trustedRootCertificateRef", r.reference, context.providers)
    return InternalTls(
        certificate_ref=need(certificate),
        private_key_ref=need(private_key),
        trusted_root_certificate_ref=need(root),
    )


def _authentication(value: object, path: str, context: Context) -> Authentication:
    block = r.mapping(
        value,
        path,
        context.problems,
        required=("issuer", "audience", "signingKeys", "policies"),
        optional=("algorithms", "clockSkewSeconds", "clientAssertionAudience"),
    )
    signing_keys = block.read("signingKeys", _signing_keys, context)
    algorithms = block.optional("algorithms", DEFAULT_ALGORITHMS, _algorithms, context.problems)
    skew = block.optional(
        "clockSkewSeconds", DEFAULT_CLOCK_SKEW_SECONDS, r.integer, low=0, high=300
    )
    assertion_audience = block.optional(
        "clientAssertionAudience", ASSERTION_AUDIENCE_TOKEN_ENDPOINT, _assertion_audience
    )
    audience = block.read("audience", r.string, max_bytes=2048)
    issuer = block.read("issuer", r.url)
    policies = block.read("policies", _policies, context)
    return Authentication(
        issuer=need(issuer),
        audience=need(audience),
        signing_keys=need(signing_keys),
        algorithms=need(algorithms),
        clock_skew_seconds=need(skew),
        policies=need(policies),
        client_assertion_audience=need(assertion_audience),
    )


def _signing_keys(value: object, path: str, context: Context) -> SigningKeys:
    block = r.mapping(value, path, context.problems, optional=("jwksUrl", "jwksRef"))
    exactly_one = ("jwksUrl" in block) != ("jwksRef" in block)
    if not exactly_one:
        context.problems.add(ConfigInvalid(path, "set exactly one of jwksUrl and jwksRef"))
    jwks_url = block.optional("jwksUrl", None, r.url, allow_query=True)
    jwks_ref = block.optional("jwksRef", None, r.reference, context.providers)
    if not exactly_one:
        raise AlreadyReported
    return SigningKeys(jwks_url=need(jwks_url), jwks_ref=need(jwks_ref))


def _assertion_audience(value: object, path: str) -> str:
    audience = r.string(value, path)
    if audience not in CLIENT_ASSERTION_AUDIENCES:
        raise ConfigInvalid(path, "must be " + " or ".join(CLIENT_ASSERTION_AUDIENCES))
    return audience


def _algorithms(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    entries = r.sequence(value, path, min_items=1, max_items=len(SUPPORTED_ALGORITHMS))
    result: list[Maybe[str]] = []
    for position, entry in enumerate(entries):
        result.append(problems.attempt(_algorithm, entry, index(path, position), result))
    return tuple(need_all(result))


def _algorithm(value: object, path: str, earlier: list[Maybe[str]]) -> str:
    name = r.string(value, path, max_bytes=16)
    if name.lower() == "none" or name.upper().startswith("HS"):
        raise ConfigInvalid(path, "unsigned and shared-secret (HS*) algorithms are never accepted")
    if name not in SUPPORTED_ALGORITHMS:
        raise ConfigInvalid(path, "must be one of " + ", ".join(SUPPORTED_ALGORITHMS))
    if name in earlier:
        raise ConfigInvalid(path, "listed twice")
    return name


def _policies(value: object, path: str, context: Context) -> dict[str, Policy]:
    entries = r.named_entries(value, path)
    result: dict[str, Maybe[Policy]] = {}
    for client_id, entry in entries.items():
        entry_path = key(path, client_id)
        named = context.problems.attempt(r.visible, client_id, entry_path, max_len=255)
        policy = context.problems.attempt(_policy, client_id, entry, entry_path, context)
        if policy is not FAILED:
            context.loaded.policies[client_id] = policy
        result[client_id] = FAILED if named is FAILED else policy
    return dict(zip(result, need_all(result.values()), strict=True))


def _policy(client_id: str, value: object, path: str, context: Context) -> Policy:
    problems = context.problems
    block = r.mapping(
        value, path, problems, required=("actions",), optional=("operator", "workflows")
    )
    operator = block.optional("operator", False, r.boolean)
    actions = block.read("actions", _actions, problems, operator)
    workflows_path = key(path, "workflows")
    workflows: Maybe[tuple[str, ...] | None] = None
    # Whether the policy has run actions decides whether workflows belong here; when the
    # actions were refused it cannot be told, and neither rule is judged.
    has_run_actions = (
        None if actions is FAILED else any(action in RUN_ACTIONS for action in actions)
    )
    if "workflows" in block:
        if has_run_actions is False:
            problems.add(
                ConfigInvalid(
                    workflows_path,
                    "a policy with only deployment-wide actions must not list workflows",
                )
            )
            workflows = FAILED
        else:
            workflows = block.read("workflows", _policy_workflows, problems)
    elif has_run_actions:
        problems.add(
            ConfigInvalid(
                workflows_path, "required: run actions apply to the workflows listed here"
            )
        )
        workflows = FAILED
    return Policy(
        client_id=client_id,
        operator=need(operator),
        workflows=need(workflows),
        actions=need(actions),
    )


def _actions(
    value: object, path: str, problems: Problems, operator: Maybe[bool]
) -> tuple[str, ...]:
    actions: list[Maybe[str]] = []
    for position, entry in enumerate(r.sequence(value, path, min_items=1)):
        actions.append(problems.attempt(_action, entry, index(path, position), actions, operator))
    return tuple(need_all(actions))


def _action(value: object, path: str, earlier: list[Maybe[str]], operator: Maybe[bool]) -> str:
    action = r.string(value, path, max_bytes=64)
    if action not in RUN_ACTIONS and action not in DEPLOYMENT_ACTIONS:
        raise ConfigInvalid(path, "unknown action")
    if action in earlier:
        raise ConfigInvalid(path, "listed twice")
    # Both rules below depend on operator; a refused operator value skips them.
    if action in DEPLOYMENT_ACTIONS and operator is False:
        raise ConfigInvalid(path, f"{action} acts on the whole deployment and needs operator: true")
    if action == "start" and operator is True:
        raise ConfigInvalid(
            path, "an operator policy may not start runs; give producers their own policy"
        )
    return action


def _policy_workflows(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    listed: list[Maybe[str]] = []
    for position, entry in enumerate(r.sequence(value, path, min_items=1)):
        listed.append(problems.attempt(_listed_workflow, entry, index(path, position), listed))
    return tuple(need_all(listed))


def _listed_workflow(value: object, path: str, earlier: list[Maybe[str]]) -> str:
    workflow = _workflow_id(value, path)
    if workflow in earlier:
        raise ConfigInvalid(path, "listed twice")
    return workflow


def _state_keys(value: object, path: str, context: Context) -> tuple[StateKey, ...]:
    result: list[Maybe[StateKey]] = []
    for position, entry in enumerate(r.sequence(value, path, min_items=1)):
        result.append(
            context.problems.attempt(_state_key, entry, index(path, position), context, result)
        )
    return tuple(need_all(result))


def _state_key(
    value: object, path: str, context: Context, earlier: list[Maybe[StateKey]]
) -> StateKey:
    block = r.mapping(value, path, context.problems, required=("version", "ref"))
    version = block.read("version", r.integer, low=1, high=2**31 - 1)
    if version is not FAILED and any(
        existing is not FAILED and existing.version == version for existing in earlier
    ):
        context.problems.add(ConfigInvalid(key(path, "version"), "versions must be unique"))
        version = FAILED
    ref = block.read("ref", r.reference, context.providers)
    return StateKey(version=need(version), ref=need(ref))


def _workflow_id(value: object, path: str) -> str:
    return r.string(
        value,
        path,
        pattern=WORKFLOW_ID,
        expected="a workflow id: a lowercase letter, then up to 62 of a-z 0-9 -",
    )
