"""Read a runtime file into :class:`core.config.model.RuntimeConfig` (CONTRACT §5).

Loading refuses, naming the dotted key path: YAML that is not strict plain data, unknown or
missing keys, wrong types, values out of bounds, and every rule that can be judged from the
file alone. The rules that need the packages (workflow ids, required connections) are in
:mod:`core.config.check`. Nothing here opens a secret or contacts the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from core import yamlsafe
from core.config import reader as r
from core.config.model import (
    ASSERTION_AUDIENCE_TOKEN_ENDPOINT,
    CASEWORK,
    CLIENT_ASSERTION_AUDIENCES,
    CONNECTION_TYPES,
    DEFAULT_ALGORITHMS,
    DEFAULT_CALL_TIMEOUT_SECONDS,
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_RESULT_CHECK_SECONDS,
    DEPLOYMENT_ACTIONS,
    INTERNAL_COMPONENTS,
    REQUIRED_INTERNAL_COMPONENTS,
    RUN_ACTIONS,
    TLS_TERMINATION,
    Authentication,
    BindAddress,
    Completion,
    Connection,
    ConnectionAuthorization,
    DatabaseSettings,
    Deployment,
    EventSource,
    FileProvider,
    Internal,
    InternalTls,
    Listener,
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
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}")
SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,256}")
URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[\x21-\x7e]+")

_NAME_RULE = "a letter, then up to 63 letters, digits, _ or -"


def load_runtime_file(path: Path) -> RuntimeConfig:
    """Read and check a runtime file; relative paths in it are taken from its folder."""
    location = Path(os.path.abspath(path))
    try:
        with open(location, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        raise ConfigInvalid("", f"cannot read the runtime file {location}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigInvalid("", f"the runtime file {location} is larger than 1 MiB")
    return parse_runtime(yamlsafe.load(data, ConfigInvalid), location)


def parse_runtime(document: object, location: Path) -> RuntimeConfig:
    """Turn the loaded YAML document of the runtime file at ``location`` into a record."""
    if document is None:
        raise ConfigInvalid("", "the runtime file is empty")
    top = r.mapping(
        document,
        "",
        required=("namespace", "secretProviders", "database", "deployment"),
        optional=("eventSources", "connections"),
    )
    base = location.parent
    namespace = _namespace(top["namespace"])
    providers = _providers(top["secretProviders"], base)
    database = _database(top["database"], providers)
    event_sources = _event_sources(top.get("eventSources", {}), providers)
    deployment = _deployment(top["deployment"], providers, base)
    connections = _connections(top.get("connections", {}), providers)
    return RuntimeConfig(
        path=location,
        namespace=namespace,
        secret_providers=providers,
        database=database,
        event_sources=event_sources,
        deployment=deployment,
        connections=connections,
    )


def _namespace(value: object) -> str:
    text = r.string(
        value,
        "namespace",
        pattern=NAMESPACE,
        expected="coordinator_ followed by lowercase letters, digits or _",
        max_bytes=1024,
    )
    if len(text.encode("utf-8")) > NAMESPACE_MAX_BYTES:
        raise ConfigInvalid("namespace", f"must be at most {NAMESPACE_MAX_BYTES} bytes")
    return text


def _providers(value: object, base: Path) -> SecretProviders:
    path = "secretProviders"
    block = r.mapping(value, path, optional=("file", "environment"))
    file_provider = None
    if "file" in block:
        file_path = key(path, "file")
        file_block = r.mapping(block["file"], file_path, required=("root",))
        file_provider = FileProvider(
            root=r.local_path(file_block["root"], key(file_path, "root"), base)
        )
    environment = "environment" in block
    if environment:
        # The block has no settings today; it exists so that enabling it is explicit.
        r.mapping(block["environment"], key(path, "environment"))
    return SecretProviders(file=file_provider, environment=environment)


def _database(value: object, providers: SecretProviders) -> DatabaseSettings:
    path = "database"
    block = r.mapping(
        value,
        path,
        required=("runtimeUrlRef", "migrationUrlRef"),
        optional=("trustedRootCertificateRef",),
    )
    root_ref = block.get("trustedRootCertificateRef")
    return DatabaseSettings(
        runtime_url_ref=r.reference(block["runtimeUrlRef"], key(path, "runtimeUrlRef"), providers),
        migration_url_ref=r.reference(
            block["migrationUrlRef"], key(path, "migrationUrlRef"), providers
        ),
        trusted_root_certificate_ref=None
        if root_ref is None
        else r.reference(root_ref, key(path, "trustedRootCertificateRef"), providers),
    )


def _event_sources(value: object, providers: SecretProviders) -> dict[str, EventSource]:
    path = "eventSources"
    entries = r.named_entries(value, path)
    result: dict[str, EventSource] = {}
    first_by_source: dict[str, str] = {}
    for name, entry in entries.items():
        entry_path = key(path, name)
        _name(name, entry_path)
        block = r.mapping(entry, entry_path, required=("source", "signingKeyRef", "workflow"))
        source = r.visible(block["source"], key(entry_path, "source"), max_len=2048)
        if source in first_by_source:
            raise ConfigInvalid(
                key(entry_path, "source"),
                f"the same source as eventSources.{first_by_source[source]}; "
                "sources must be unique",
            )
        first_by_source[source] = name
        result[name] = EventSource(
            name=name,
            source=source,
            signing_key_ref=r.reference(
                block["signingKeyRef"], key(entry_path, "signingKeyRef"), providers
            ),
            workflow=_workflow_id(block["workflow"], key(entry_path, "workflow")),
        )
    return result


def _deployment(value: object, providers: SecretProviders, base: Path) -> Deployment:
    path = "deployment"
    block = r.mapping(
        value,
        path,
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
        optional=("metricsListener", "internal"),
    )
    database_id = r.string(
        block["databaseId"],
        key(path, "databaseId"),
        pattern=UUID,
        expected="a UUID (8-4-4-4-12 hexadecimal digits)",
    ).lower()
    runtime_role = r.string(
        block["runtimeRole"],
        key(path, "runtimeRole"),
        pattern=ROLE,
        expected="a PostgreSQL role name: a lowercase letter or _, then up to 62 of a-z 0-9 _",
    )
    packages = _packages(block["packages"], key(path, "packages"), base)
    listener = _listener(block["listener"], key(path, "listener"))
    metrics = None
    if "metricsListener" in block:
        metrics = _metrics_listener(
            block["metricsListener"], key(path, "metricsListener"), listener
        )
    internal = None
    if "internal" in block:
        internal = _internal(block["internal"], key(path, "internal"), providers, base)
    authentication = _authentication(
        block["authentication"], key(path, "authentication"), providers
    )
    audit_file = r.local_path(block["auditFile"], key(path, "auditFile"), base)
    audit_key_ref = r.reference(block["auditKeyRef"], key(path, "auditKeyRef"), providers)
    state_keys = _state_keys(block["stateKeys"], key(path, "stateKeys"), providers)
    active = r.integer(block["activeStateKey"], key(path, "activeStateKey"), low=1, high=2**31 - 1)
    if active not in {state_key.version for state_key in state_keys}:
        raise ConfigInvalid(key(path, "activeStateKey"), "names no version listed in stateKeys")
    admission_key_ref = r.reference(
        block["admissionKeyRef"], key(path, "admissionKeyRef"), providers
    )
    return Deployment(
        database_id=database_id,
        runtime_role=runtime_role,
        packages=packages,
        listener=listener,
        metrics_listener=metrics,
        internal=internal,
        authentication=authentication,
        audit_file=audit_file,
        audit_key_ref=audit_key_ref,
        state_keys=state_keys,
        active_state_key=active,
        admission_key_ref=admission_key_ref,
    )


def _packages(value: object, path: str, base: Path) -> tuple[PackagePin, ...]:
    entries = r.sequence(value, path, min_items=1, max_items=MAX_PACKAGES)
    pins = []
    for position, entry in enumerate(entries):
        entry_path = index(path, position)
        block = r.mapping(entry, entry_path, required=("root", "expectedDigest"))
        pins.append(
            PackagePin(
                root=r.local_path(block["root"], key(entry_path, "root"), base),
                expected_digest=r.string(
                    block["expectedDigest"],
                    key(entry_path, "expectedDigest"),
                    pattern=DIGEST,
                    expected="sha256: followed by 64 lowercase hexadecimal digits",
                ),
            )
        )
    return tuple(pins)


def _listener(value: object, path: str) -> Listener:
    block = r.mapping(value, path, required=("bind", "tlsTermination"), optional=("publicUrl",))
    termination = r.string(block["tlsTermination"], key(path, "tlsTermination"))
    if termination != TLS_TERMINATION:
        raise ConfigInvalid(key(path, "tlsTermination"), f"must be {TLS_TERMINATION}")
    public_url = None
    if "publicUrl" in block:
        public_url = r.url(block["publicUrl"], key(path, "publicUrl"))
    return Listener(
        bind=r.bind(block["bind"], key(path, "bind")),
        tls_termination=termination,
        public_url=public_url,
    )


def _metrics_listener(value: object, path: str, listener: Listener) -> MetricsListener:
    block = r.mapping(value, path, required=("bind",))
    bind = r.bind(block["bind"], key(path, "bind"))
    if _same_socket(bind, listener.bind):
        raise ConfigInvalid(key(path, "bind"), "must differ from deployment.listener.bind")
    return MetricsListener(bind=bind)


def _same_socket(one: BindAddress, other: BindAddress) -> bool:
    return one.port == other.port and one.address == other.address


def _internal(value: object, path: str, providers: SecretProviders, base: Path) -> Internal:
    block = r.mapping(value, path, optional=("socketDir", "addresses", "tls"))
    if "socketDir" in block and "addresses" in block:
        raise ConfigInvalid(key(path, "addresses"), "use either socketDir or addresses, not both")
    if "socketDir" in block:
        if "tls" in block:
            raise ConfigInvalid(key(path, "tls"), "only used with addresses")
        socket_dir = r.local_path(block["socketDir"], key(path, "socketDir"), base)
        if len(str(socket_dir).encode()) > SOCKET_DIR_MAX_BYTES:
            raise ConfigInvalid(
                key(path, "socketDir"),
                f"must be at most {SOCKET_DIR_MAX_BYTES} bytes once resolved, so that the "
                "components' Unix socket paths fit the system's limit",
            )
        return Internal(socket_dir=socket_dir, addresses={}, tls=None)
    if "addresses" not in block:
        raise ConfigInvalid(path, "needs socketDir or addresses")
    if "tls" not in block:
        raise ConfigInvalid(key(path, "tls"), "required with addresses (mutual TLS)")
    addresses_path = key(path, "addresses")
    entries = r.mapping(
        block["addresses"],
        addresses_path,
        required=REQUIRED_INTERNAL_COMPONENTS,
        optional=tuple(c for c in INTERNAL_COMPONENTS if c not in REQUIRED_INTERNAL_COMPONENTS),
    )
    addresses: dict[str, BindAddress] = {}
    for component, entry in entries.items():
        address = r.bind(entry, key(addresses_path, component))
        for other, taken in addresses.items():
            if _same_socket(address, taken):
                raise ConfigInvalid(key(addresses_path, component), f"the same address as {other}")
        addresses[component] = address
    tls_path = key(path, "tls")
    tls = r.mapping(
        block["tls"],
        tls_path,
        required=("certificateRef", "privateKeyRef", "trustedRootCertificateRef"),
    )
    return Internal(
        socket_dir=None,
        addresses=addresses,
        tls=InternalTls(
            certificate_ref=r.reference(
                tls["certificateRef"], key(tls_path, "certificateRef"), providers
            ),
            private_key_ref=r.reference(
                tls["privateKeyRef"], key(tls_path, "privateKeyRef"), providers
            ),
            trusted_root_certificate_ref=r.reference(
                tls["trustedRootCertificateRef"],
                key(tls_path, "trustedRootCertificateRef"),
                providers,
            ),
        ),
    )


def _authentication(value: object, path: str, providers: SecretProviders) -> Authentication:
    block = r.mapping(
        value,
        path,
        required=("issuer", "audience", "signingKeys", "policies"),
        optional=("algorithms", "clockSkewSeconds", "clientAssertionAudience"),
    )
    keys_path = key(path, "signingKeys")
    keys = r.mapping(block["signingKeys"], keys_path, optional=("jwksUrl", "jwksRef"))
    if ("jwksUrl" in keys) == ("jwksRef" in keys):
        raise ConfigInvalid(keys_path, "set exactly one of jwksUrl and jwksRef")
    signing_keys = SigningKeys(
        jwks_url=r.url(keys["jwksUrl"], key(keys_path, "jwksUrl"), allow_query=True)
        if "jwksUrl" in keys
        else None,
        jwks_ref=r.reference(keys["jwksRef"], key(keys_path, "jwksRef"), providers)
        if "jwksRef" in keys
        else None,
    )
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    if "algorithms" in block:
        algorithms = _algorithms(block["algorithms"], key(path, "algorithms"))
    skew = DEFAULT_CLOCK_SKEW_SECONDS
    if "clockSkewSeconds" in block:
        skew = r.integer(block["clockSkewSeconds"], key(path, "clockSkewSeconds"), low=0, high=300)
    assertion_audience = ASSERTION_AUDIENCE_TOKEN_ENDPOINT
    if "clientAssertionAudience" in block:
        assertion_path = key(path, "clientAssertionAudience")
        assertion_audience = r.string(block["clientAssertionAudience"], assertion_path)
        if assertion_audience not in CLIENT_ASSERTION_AUDIENCES:
            raise ConfigInvalid(
                assertion_path, "must be " + " or ".join(CLIENT_ASSERTION_AUDIENCES)
            )
    audience = r.string(block["audience"], key(path, "audience"), max_bytes=2048)
    return Authentication(
        issuer=r.url(block["issuer"], key(path, "issuer")),
        audience=audience,
        signing_keys=signing_keys,
        algorithms=algorithms,
        clock_skew_seconds=skew,
        policies=_policies(block["policies"], key(path, "policies")),
        client_assertion_audience=assertion_audience,
    )


def _algorithms(value: object, path: str) -> tuple[str, ...]:
    entries = r.sequence(value, path, min_items=1, max_items=len(SUPPORTED_ALGORITHMS))
    result: list[str] = []
    for position, entry in enumerate(entries):
        entry_path = index(path, position)
        name = r.string(entry, entry_path, max_bytes=16)
        if name.lower() == "none" or name.upper().startswith("HS"):
            raise ConfigInvalid(
                entry_path, "unsigned and shared-secret (HS*) algorithms are never accepted"
            )
        if name not in SUPPORTED_ALGORITHMS:
            raise ConfigInvalid(entry_path, "must be one of " + ", ".join(SUPPORTED_ALGORITHMS))
        if name in result:
            raise ConfigInvalid(entry_path, "listed twice")
        result.append(name)
    return tuple(result)


def _policies(value: object, path: str) -> dict[str, Policy]:
    entries = r.named_entries(value, path)
    result: dict[str, Policy] = {}
    for client_id, entry in entries.items():
        entry_path = key(path, client_id)
        r.visible(client_id, entry_path, max_len=255)
        result[client_id] = _policy(client_id, entry, entry_path)
    return result


def _policy(client_id: str, value: object, path: str) -> Policy:
    block = r.mapping(value, path, required=("actions",), optional=("operator", "workflows"))
    operator = r.boolean(block["operator"], key(path, "operator")) if "operator" in block else False
    actions_path = key(path, "actions")
    actions: list[str] = []
    for position, entry in enumerate(r.sequence(block["actions"], actions_path, min_items=1)):
        entry_path = index(actions_path, position)
        action = r.string(entry, entry_path, max_bytes=64)
        if action not in RUN_ACTIONS and action not in DEPLOYMENT_ACTIONS:
            raise ConfigInvalid(entry_path, "unknown action")
        if action in actions:
            raise ConfigInvalid(entry_path, "listed twice")
        if action in DEPLOYMENT_ACTIONS and not operator:
            raise ConfigInvalid(
                entry_path, f"{action} acts on the whole deployment and needs operator: true"
            )
        if action == "start" and operator:
            raise ConfigInvalid(
                entry_path, "an operator policy may not start runs; give producers their own policy"
            )
        actions.append(action)
    has_run_actions = any(action in RUN_ACTIONS for action in actions)
    workflows_path = key(path, "workflows")
    workflows: tuple[str, ...] | None = None
    if "workflows" in block:
        if not has_run_actions:
            raise ConfigInvalid(
                workflows_path,
                "a policy with only deployment-wide actions must not list workflows",
            )
        listed: list[str] = []
        for position, entry in enumerate(
            r.sequence(block["workflows"], workflows_path, min_items=1)
        ):
            entry_path = index(workflows_path, position)
            workflow = _workflow_id(entry, entry_path)
            if workflow in listed:
                raise ConfigInvalid(entry_path, "listed twice")
            listed.append(workflow)
        workflows = tuple(listed)
    elif has_run_actions:
        raise ConfigInvalid(
            workflows_path, "required: run actions apply to the workflows listed here"
        )
    return Policy(
        client_id=client_id, operator=operator, workflows=workflows, actions=tuple(actions)
    )


def _state_keys(value: object, path: str, providers: SecretProviders) -> tuple[StateKey, ...]:
    result: list[StateKey] = []
    for position, entry in enumerate(r.sequence(value, path, min_items=1)):
        entry_path = index(path, position)
        block = r.mapping(entry, entry_path, required=("version", "ref"))
        version = r.integer(block["version"], key(entry_path, "version"), low=1, high=2**31 - 1)
        if any(existing.version == version for existing in result):
            raise ConfigInvalid(key(entry_path, "version"), "versions must be unique")
        result.append(
            StateKey(
                version=version, ref=r.reference(block["ref"], key(entry_path, "ref"), providers)
            )
        )
    return tuple(result)


def _connections(value: object, providers: SecretProviders) -> dict[str, Connection]:
    path = "connections"
    entries = r.named_entries(value, path)
    result: dict[str, Connection] = {}
    bindings: dict[str, str] = {}
    for name, entry in entries.items():
        entry_path = key(path, name)
        _name(name, entry_path)
        connection = _connection(name, entry, entry_path, providers)
        if connection.completion is not None:
            binding = connection.completion.recipient_binding
            if binding in bindings:
                raise ConfigInvalid(
                    key(key(entry_path, "completion"), "recipientBinding"),
                    f"the same binding as connections.{bindings[binding]}; bindings must be unique",
                )
            bindings[binding] = name
        result[name] = connection
    return result


_CASEWORK_ONLY = ("producer", "completion", "resultCheckSeconds")


def _connection(name: str, value: object, path: str, providers: SecretProviders) -> Connection:
    block = r.mapping(
        value,
        path,
        required=("type", "baseUrl", "profile", "authorization"),
        optional=(*_CASEWORK_ONLY, "callTimeoutSeconds", "trustedRootCertificateRef"),
    )
    kind = r.string(block["type"], key(path, "type"), max_bytes=64)
    if kind not in CONNECTION_TYPES:
        raise ConfigInvalid(key(path, "type"), "must be one of " + ", ".join(CONNECTION_TYPES))
    if kind != CASEWORK:
        for extra in _CASEWORK_ONLY:
            if extra in block:
                raise ConfigInvalid(key(path, extra), f"only {CASEWORK} connections take {extra}")
    elif "producer" not in block:
        raise ConfigInvalid(key(path, "producer"), f"required for {CASEWORK} connections")
    producer = completion = result_check = None
    if kind == CASEWORK:
        producer = r.visible(block["producer"], key(path, "producer"), max_len=128)
        if "completion" in block:
            completion = _completion(block["completion"], key(path, "completion"), providers)
        result_check = DEFAULT_RESULT_CHECK_SECONDS
        if "resultCheckSeconds" in block:
            result_check = r.integer(
                block["resultCheckSeconds"], key(path, "resultCheckSeconds"), low=60, high=86400
            )
    call_timeout = DEFAULT_CALL_TIMEOUT_SECONDS
    if "callTimeoutSeconds" in block:
        call_timeout = r.integer(
            block["callTimeoutSeconds"], key(path, "callTimeoutSeconds"), low=1, high=300
        )
    root_ref = None
    if "trustedRootCertificateRef" in block:
        root_ref = r.reference(
            block["trustedRootCertificateRef"], key(path, "trustedRootCertificateRef"), providers
        )
    return Connection(
        name=name,
        type=kind,
        base_url=r.url(block["baseUrl"], key(path, "baseUrl")),
        profile=r.string(
            block["profile"],
            key(path, "profile"),
            pattern=PROFILE,
            expected="1 to 128 of A-Z a-z 0-9 . _ ~ - (not starting with . _ ~ -)",
        ),
        authorization=_authorization(block["authorization"], key(path, "authorization"), providers),
        producer=producer,
        completion=completion,
        result_check_seconds=result_check,
        call_timeout_seconds=call_timeout,
        trusted_root_certificate_ref=root_ref,
    )


def _authorization(value: object, path: str, providers: SecretProviders) -> ConnectionAuthorization:
    block = r.mapping(
        value, path, required=("clientId", "signingKeyRef", "scopes"), optional=("audience",)
    )
    scopes_path = key(path, "scopes")
    scopes: list[str] = []
    for position, entry in enumerate(r.sequence(block["scopes"], scopes_path, min_items=1)):
        entry_path = index(scopes_path, position)
        scope = r.string(
            entry,
            entry_path,
            pattern=SCOPE,
            expected="an OAuth scope: 1 to 256 visible ASCII characters "
            "without spaces, quotes or backslashes",
        )
        if scope in scopes:
            raise ConfigInvalid(entry_path, "listed twice")
        scopes.append(scope)
    audience = None
    if "audience" in block:
        audience = r.string(
            block["audience"],
            key(path, "audience"),
            pattern=URI_SCHEME,
            expected="an absolute URI",
            max_bytes=2048,
        )
        if "#" in audience:
            raise ConfigInvalid(key(path, "audience"), "must not have a fragment")
    return ConnectionAuthorization(
        client_id=r.visible(block["clientId"], key(path, "clientId"), max_len=255),
        signing_key_ref=r.reference(block["signingKeyRef"], key(path, "signingKeyRef"), providers),
        scopes=tuple(scopes),
        audience=audience,
    )


def _completion(value: object, path: str, providers: SecretProviders) -> Completion:
    block = r.mapping(value, path, required=("recipientBinding", "bearerTokenRef"))
    return Completion(
        recipient_binding=r.visible(
            block["recipientBinding"], key(path, "recipientBinding"), max_len=256
        ),
        bearer_token_ref=r.reference(
            block["bearerTokenRef"], key(path, "bearerTokenRef"), providers
        ),
    )


def _name(name: str, path: str) -> None:
    if not NAME.fullmatch(name):
        raise ConfigInvalid(path, f"a name must be {_NAME_RULE}")


def _workflow_id(value: object, path: str) -> str:
    return r.string(
        value,
        path,
        pattern=WORKFLOW_ID,
        expected="a workflow id: a lowercase letter, then up to 62 of a-z 0-9 -",
    )
