"""The runtime file as typed, frozen records (CONTRACT §5).

Every record here has passed the loader's checks: types, unknown keys, bounds and the rules
that need nothing but the file itself. Paths are absolute (relative ones were resolved
against the directory holding the runtime file). Secret values never appear: only
:class:`core.secrets.SecretRef` references.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from core.secrets import SecretRef
from core.workflow.package import VerifiedPackage

CASEWORK: Final = "casework-review-producer"
MESSAGING: Final = "messaging"
SCHEDULING: Final = "scheduling"
BREG_ACTION: Final = "breg-action"
CONNECTION_TYPES: Final = (CASEWORK, MESSAGING, SCHEDULING, BREG_ACTION)
"""Every connection type a runtime file may declare."""


TLS_TERMINATION: Final = "operator-controlled-upstream"
"""The only accepted ``listener.tlsTermination``."""

DEFAULT_MAX_CONNECTIONS: Final = 512
"""``listener.maxConnections`` by default: well under the 1024 open files a process is
commonly allowed, with room left for the gateway's other sockets."""
MAX_CONNECTIONS_LIMIT: Final = 65535
DEFAULT_HEADER_TIMEOUT_SECONDS: Final = 10
"""``listener.headerTimeoutSeconds`` by default: ample for a terminator on the same network."""
MAX_HEADER_TIMEOUT_SECONDS: Final = 300
DEFAULT_CLOCK_SKEW_SECONDS: Final = 60
DEFAULT_RESULT_CHECK_SECONDS: Final = 900
DEFAULT_CALL_TIMEOUT_SECONDS: Final = 30
DEFAULT_RETRYING_AFTER_SECONDS: Final = 600
"""``attention.retryingAfterSeconds`` by default: ten minutes of retryable answers."""
MIN_RETRYING_AFTER_SECONDS: Final = 60
MAX_RETRYING_AFTER_SECONDS: Final = 86400
DEFAULT_ALGORITHMS: Final = ("RS256", "ES256")

ASSERTION_AUDIENCE_TOKEN_ENDPOINT: Final = "token-endpoint"  # noqa: S105 - a setting, not a secret
ASSERTION_AUDIENCE_ISSUER: Final = "issuer"
CLIENT_ASSERTION_AUDIENCES: Final = (ASSERTION_AUDIENCE_TOKEN_ENDPOINT, ASSERTION_AUDIENCE_ISSUER)
"""Accepted ``authentication.clientAssertionAudience`` values; the first is the default."""

INTERNAL_COMPONENTS: Final = ("admission", "dispatcher", "recovery", "auditd")
"""Components that may be given an internal TCP address."""
REQUIRED_INTERNAL_COMPONENTS: Final = ("admission", "recovery", "auditd")
"""Components whose address must be given when ``internal.addresses`` is used."""


@dataclass(frozen=True)
class FileProvider:
    """``secretProviders.file``."""

    root: Path
    """Folder whose direct children are the ``secret:file/<name>`` files."""


@dataclass(frozen=True)
class SecretProviders:
    """``secretProviders``: where references resolve."""

    file: FileProvider | None
    """The file provider, or ``None`` when ``secret:file/`` references are not allowed."""
    environment: bool
    """True when ``environment: {}`` is present and ``secret:env/`` references are allowed."""


@dataclass(frozen=True)
class DatabaseSettings:
    """``database``: how the coordinator reaches PostgreSQL."""

    runtime_url_ref: SecretRef
    """Text secret: the runtime role's connection URL (TLS required)."""
    migration_url_ref: SecretRef
    """Text secret: the migration role's URL; only ``apply`` reads it."""
    trusted_root_certificate_ref: SecretRef | None
    """Text secret: a PEM root to verify the server with instead of the system roots."""


@dataclass(frozen=True)
class EventSource:
    """``eventSources.<name>``: a trusted producer of signed events that start runs."""

    name: str
    """The key under ``eventSources``."""
    source: str
    """The events' ``source`` attribute; unique across event sources."""
    signing_key_ref: SecretRef
    """Binary secret, at least 32 bytes: the HMAC-SHA-256 key of the signatures."""
    workflow: str
    """Id of the packaged workflow its events start."""


@dataclass(frozen=True)
class PackagePin:
    """``deployment.packages[i]``."""

    root: Path
    """The package folder (absolute)."""
    expected_digest: str
    """``sha256:`` + 64 lowercase hex digits."""


@dataclass(frozen=True)
class BindAddress:
    """A ``host:port`` to listen on; ``host`` is an IP literal or ``localhost``."""

    host: str
    """The host as written, without IPv6 brackets."""
    port: int
    """1..65535."""

    @property
    def address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The IP address (``localhost`` is 127.0.0.1)."""
        return ipaddress.ip_address("127.0.0.1" if self.host == "localhost" else self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Listener:
    """``deployment.listener``: the public HTTP listener."""

    bind: BindAddress
    """Private, loopback or link-local address and port."""
    tls_termination: str
    """Always ``operator-controlled-upstream``."""
    public_url: str | None
    """The URL clients use, for problem ``instance`` and completion URLs; optional."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections served at once (1..65535); beyond them a request is answered 503
    ``service.unavailable`` and its connection closed. Requests still running after their
    client left count too."""
    header_timeout_seconds: int = DEFAULT_HEADER_TIMEOUT_SECONDS
    """Seconds (1..300) a request's head may take to arrive in full, counted from the
    connection opening or the previous answer on it; then the connection is closed."""


@dataclass(frozen=True)
class MetricsListener:
    """``deployment.metricsListener``: where ``/metrics`` is served."""

    bind: BindAddress
    """Private, loopback or link-local address and port, not the main listener's."""


LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error")
"""``deployment.logging.level`` values, most to least talkative."""
LOG_FORMATS: Final = ("text", "json")
"""``deployment.logging.format`` values: one line of text, or one JSON object, per record."""


@dataclass(frozen=True)
class Logging:
    """``deployment.logging``: how much each component writes to standard error, and how."""

    level: str = "notice"
    """One of :data:`LOG_LEVELS`; ``notice`` shows starts, stops and every warning."""
    format: str = "text"
    """One of :data:`LOG_FORMATS`."""


@dataclass(frozen=True)
class Attention:
    """``deployment.attention``: when a run asks for an operator without any step of it
    being uncertain."""

    retrying_after_seconds: int = DEFAULT_RETRYING_AFTER_SECONDS
    """Seconds (60..86400, default 600) a call may keep getting retryable answers (counted
    from the first of an unbroken series) before its run shows ``attention: true``, with
    the step's cause ``retrying``, until the step next prepares or ends."""


@dataclass(frozen=True)
class InternalTls:
    """``deployment.internal.tls``: mutual TLS for the internal gRPC channel."""

    certificate_ref: SecretRef
    """Text secret: this host's PEM certificate (chain)."""
    private_key_ref: SecretRef
    """Text secret: the PEM private key of that certificate."""
    trusted_root_certificate_ref: SecretRef
    """Text secret: the PEM root peers' certificates must chain to."""


@dataclass(frozen=True)
class Internal:
    """``deployment.internal``: either a socket folder or TCP addresses with mutual TLS."""

    socket_dir: Path | None
    """Folder for the components' Unix sockets (absolute), or ``None`` with addresses."""
    addresses: Mapping[str, BindAddress]
    """Component name → TCP address; empty with ``socket_dir``."""
    tls: InternalTls | None
    """Present exactly when ``addresses`` is used."""
    metrics_port: int | None = None
    """With ``addresses``: the port each component serves its own ``/metrics`` on."""


@dataclass(frozen=True)
class SigningKeys:
    """``deployment.authentication.signingKeys``: exactly one of the two is set."""

    jwks_url: str | None
    """The issuer's JWKS URL."""
    jwks_ref: SecretRef | None
    """Text secret: a JWKS document kept locally instead of fetched."""


@dataclass(frozen=True)
class Policy:
    """``deployment.authentication.policies.<client_id>``."""

    client_id: str
    """The verified ``client_id`` claim this policy applies to."""
    operator: bool
    """True for operators: they act on every run of their workflows."""
    workflows: tuple[str, ...] | None
    """Workflow ids scoping the run actions; ``None`` when the key is absent."""
    actions: tuple[str, ...]
    """Allowed actions, run actions and deployment-wide actions."""


@dataclass(frozen=True)
class Authentication:
    """``deployment.authentication``: how callers' access tokens are verified."""

    issuer: str
    """Expected ``iss``, compared exactly; https (or http to a loopback host)."""
    audience: str
    """A value the token's ``aud`` must contain."""
    signing_keys: SigningKeys
    """Where the issuer's public keys come from."""
    algorithms: tuple[str, ...]
    """Allowed JWS algorithms (asymmetric only); default RS256 and ES256."""
    clock_skew_seconds: int
    """Leeway for ``exp``/``iat``/``nbf``, 0..300; default 60."""
    policies: Mapping[str, Policy]
    """Policies keyed by ``client_id``."""
    client_assertion_audience: str = ASSERTION_AUDIENCE_TOKEN_ENDPOINT
    """What the connections' client assertions put in ``aud``: ``token-endpoint`` (the token
    endpoint URL from discovery) or ``issuer`` (the issuer identifier, as FAPI 2.0 issuers
    want)."""


@dataclass(frozen=True)
class StateKey:
    """``deployment.stateKeys[i]``: one version of the payload state key."""

    version: int
    """Positive, unique."""
    ref: SecretRef
    """32-byte key secret."""


@dataclass(frozen=True)
class Deployment:
    """``deployment``: identity, packages, listeners, authentication and keys."""

    database_id: str
    """UUID, lowercase, the deployment's durable identity."""
    runtime_role: str
    """PostgreSQL role the service connects as."""
    packages: tuple[PackagePin, ...]
    """1..16 pinned packages."""
    listener: Listener
    """The public HTTP listener."""
    metrics_listener: MetricsListener | None
    """The metrics listener, if any."""
    internal: Internal | None
    """The internal channel, or ``None`` for the default socket folder."""
    authentication: Authentication
    """Token verification and policies."""
    audit_file: Path
    """The audit journal (absolute)."""
    audit_key_ref: SecretRef
    """32-byte key for keyed references in the journal."""
    state_keys: tuple[StateKey, ...]
    """Every configured state key version, in file order."""
    active_state_key: int
    """The version new writes use."""
    admission_key_ref: SecretRef
    """32-byte key deriving start identities, run ids and command keys."""
    logging: Logging = Logging()
    """Log level and format of every component (the launcher's ``--log-level`` wins)."""
    attention: Attention = Attention()
    """When a call that keeps being retried makes its run ask for attention."""


@dataclass(frozen=True)
class ConnectionAuthorization:
    """``connections.<name>.authorization``: the connection's OAuth client."""

    client_id: str
    """The client id at the deployment's issuer."""
    signing_key_ref: SecretRef
    """Private JWK (RS256 or ES256) for ``private_key_jwt`` client authentication."""
    scopes: tuple[str, ...]
    """Scopes requested for this connection's tokens."""
    audience: str | None
    """Token ``resource``; ``None`` means the connection's ``baseUrl``."""


@dataclass(frozen=True)
class Completion:
    """``connections.<name>.completion``: Casework completion events for this connection."""

    recipient_binding: str
    """Value of the ``registry-recipient-binding`` header; unique per deployment."""
    bearer_token_ref: SecretRef
    """Text secret (at most 4096 bytes): the bearer token Casework presents."""


@dataclass(frozen=True)
class Connection:
    """``connections.<name>``: a typed link to one downstream product."""

    name: str
    """The key under ``connections``, as workflows name it."""
    type: str
    """One of :data:`CONNECTION_TYPES`."""
    base_url: str
    """Product base URL; https (or http to a loopback host)."""
    profile: str
    """The product-side profile, project or register the calls act under."""
    authorization: ConnectionAuthorization
    """The OAuth client this connection calls as."""
    producer: str | None
    """Casework only: the key under the project's ``trustedProducers``."""
    completion: Completion | None
    """Casework only, optional: completion events."""
    result_check_seconds: int | None
    """Casework only: seconds between review result reads, 60..86400 (default 900)."""
    call_timeout_seconds: int = DEFAULT_CALL_TIMEOUT_SECONDS
    """One bound, 1..300 (default 30), on a whole exchange with the product: connect, write
    the request, read the complete answer. A call step's ``deadlineSeconds`` still caps it."""
    trusted_root_certificate_ref: SecretRef | None = None
    """Text secret: PEM root(s) to verify the product's TLS certificate with instead of the
    system roots."""

    @property
    def token_audience(self) -> str:
        """The ``resource`` requested for this connection's tokens."""
        return self.authorization.audience or self.base_url


@dataclass(frozen=True)
class RuntimeConfig:
    """A whole runtime file."""

    path: Path
    """The runtime file (absolute)."""
    namespace: str
    """The SQL schema of this deployment."""
    secret_providers: SecretProviders
    """Where references resolve."""
    database: DatabaseSettings
    """Database URLs and trust."""
    event_sources: Mapping[str, EventSource]
    """Signed event producers by name (empty when absent)."""
    deployment: Deployment
    """The deployment block."""
    connections: Mapping[str, Connection]
    """Connections by name (empty when absent)."""

    def state_key(self, version: int) -> StateKey | None:
        """The configured state key of ``version``, if any."""
        for state_key in self.deployment.state_keys:
            if state_key.version == version:
                return state_key
        return None


@dataclass(frozen=True)
class CheckedDeployment:
    """A runtime file whose every rule holds and whose packages matched their digests."""

    config: RuntimeConfig
    """The loaded runtime file."""
    packages: Mapping[str, VerifiedPackage]
    """Verified packages by workflow id, in the order the file lists them."""
