"""The whole approval flow against a real, certified OpenID provider (issue 27, item 1).

panva's ``oidc-provider`` (pinned, see ``devstack.oidc_provider``) replaces the development
issuer: callers' tokens come from it (client credentials, ``client_secret_basic``,
``resource=<public URL>``) and are verified by the gateway; the dispatcher's per-connection
tokens come from it (``private_key_jwt`` with the runtime file's keys, one ``resource`` per
connection) and are verified by the stand-in products. Nothing of the development issuer
runs, so every token any component accepted was made by the provider.

The flow's last test switches the provider to its FAPI 2.0 profile, where a client assertion
must name the issuer as its ``aud``, and the coordinator to ``clientAssertionAudience:
issuer``. Then, without a stack: the gateway's verifier takes the provider's tokens in every
algorithm a deployment may allow, the pins are exact and integrity-checked, and a provider
that cannot listen fails its start plainly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from core.config.check import check_runtime_file
from core.config.load import load_runtime_file
from core.deploy import apply
from core.keys import resolver_for
from core.products.http import ProductHttp
from core.products.token_client import (
    IssuerDiscovery,
    TokenClient,
    TokenUnavailable,
    credentials_for,
)
from core.workflow.package import build_package
from devstack.oidc_provider import (
    SOURCE_DIR,
    VERSION,
    Client,
    OidcProvider,
    OidcProviders,
    ProviderError,
    ProviderStack,
    Resource,
    check_pins,
    is_installed,
    modules_dir,
)
from devstack.postgres import DatabaseHandle, PostgresCluster
from devstack.products.casework import decide
from devstack.stack import free_port, wait_until
from gateway.auth import SUPPORTED_ALGORITHMS, HttpJwksSource, TokenVerifier, VerifiedToken
from tests.reliability.exposure import EXPOSURE

# The flow's tests need the PostgreSQL server (marked so by the fixture they use) and a few
# seconds; the others need neither.
flow_test = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESULT_CHECK_SECONDS = 3600
ENDED = {"succeeded", "failed", "held", "cancelled"}
_numbers = itertools.count(1)


@dataclass
class Flow:
    stack: ProviderStack
    provider: OidcProvider

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def start(self, token: str, key: str, application: str) -> httpx.Response:
        return httpx.post(
            f"{self.stack.url}/v1/workflows/approval-notice/runs",
            json={"input": {"applicationId": application, "applicantRef": "person-9"}},
            headers={**self.auth(token), "Idempotency-Key": key},
        )

    def until_state(self, token: str, run_id: str, states: set[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal found
            answer = httpx.get(f"{self.stack.url}/v1/runs/{run_id}", headers=self.auth(token))
            found = answer.json()
            return found.get("state") in states

        wait_until(reached, f"run {run_id} in {sorted(states)}", timeout=30)
        return found

    def approve(self, application: str) -> None:
        """The reviewer approves the pending review of ``application`` at Casework."""
        casework = self.stack.product_urls["casework-review-producer"]
        project = self.stack.summary["completions"]["review"]["profile"]
        listing = httpx.get(f"{casework}/dev/projects/{project}/review-requests").json()
        [review] = [r for r in listing["reviews"] if r["subjectRef"] == application]
        decide(casework, project, review["reviewId"], "approved")

    def run_to_the_end(self, key: str, application: str) -> dict[str, Any]:
        """Start a run with a provider token, approve its review, wait for its end."""
        producer = self.stack.caller_token("producer")
        started = self.start(producer, key, application)
        assert started.status_code == 201, started.text
        run_id = started.json()["runId"]
        self.until_state(producer, run_id, {"waiting"})
        self.approve(application)
        return self.until_state(producer, run_id, ENDED)

    def messages_sent(self) -> int:
        stats = httpx.get(self.stack.product_urls["messaging"] + "/dev/stats").json()
        return sum(1 for answer in stats["answers"] if answer["status"] == 202)


class RecordingStack(ProviderStack):
    """A provider stack that remembers every caller token it got, for the secrets check."""

    def caller_token(self, role: str, *, resource: str | None = None) -> str:
        token = super().caller_token(role, resource=resource)
        EXPOSURE.keep_secret(f"oidc-flow/{role}-token-{next(_numbers)}", token)
        return token


def keep_what_the_flow_showed(stack: ProviderStack, database: DatabaseHandle) -> None:
    """The flow's logs, journal and metrics page, and every secret it used (item 7)."""
    EXPOSURE.keep_logs("oidc-flow", stack)
    EXPOSURE.keep_secret_files("oidc-flow", stack)
    EXPOSURE.keep_database("oidc-flow", database)
    for client_id, secret in stack.caller_secrets.items():
        EXPOSURE.keep_secret(f"oidc-flow/client-secret-{client_id}", secret)
    if stack.provider is not None:
        private = stack.provider.signing_jwk.get("d")
        if isinstance(private, str):
            EXPOSURE.keep_secret("oidc-flow/provider-signing-key", private)
    with contextlib.suppress(httpx.HTTPError):
        EXPOSURE.keep_response("oidc-flow/metrics", httpx.get(stack.metrics_url + "/metrics"))


@pytest.fixture(scope="module")
def flow(
    postgres_server: PostgresCluster,
    oidc_providers: OidcProviders,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Flow]:
    root = tmp_path_factory.mktemp("oidc")
    name = f"coordinator_oidc_{os.getpid()}_{next(_numbers)}"
    database = postgres_server.create_database(name)
    built = build_package(ROOT / "examples" / "approval-notice", root / "packages")
    stack = RecordingStack.prepare(
        root / "stack",
        packages=[(built.path, built.digest)],
        database=database,
        result_check_seconds=RESULT_CHECK_SECONDS,
    )
    try:
        clients, resources = stack.registrations()
        stack.provider = oidc_providers.start(
            root / "provider",
            issuer=stack.summary["issuer"],
            clients=clients,
            resources=resources,
        )
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        stack.start_coordinator()
        yield Flow(stack, stack.provider)
        keep_what_the_flow_showed(stack, database)
    finally:
        stack.stop()
        postgres_server.drop_database(name)


@flow_test
def test_a_run_started_with_a_provider_token_reaches_its_end(flow: Flow) -> None:
    stack, provider = flow.stack, flow.provider
    producer = stack.caller_token("producer")
    header = jwt.get_unverified_header(producer)
    claims = jwt.decode(producer, options={"verify_signature": False})
    # What the gateway is about to accept is the provider's own RFC 9068 token.
    assert (header["typ"], header["kid"]) == ("at+jwt", provider.signing_jwk["kid"])
    assert (claims["iss"], claims["aud"]) == (provider.issuer, stack.url)
    assert claims["client_id"] == claims["sub"] == stack.summary["producerClientId"]

    final = flow.run_to_the_end("oidc-run-1", "APP-9001")

    assert (final["state"], final["outcome"]) == ("succeeded", "approved")
    assert flow.messages_sent() == 1
    # Nothing else that issues tokens runs: the dispatcher's tokens for Casework and
    # Messaging came from the provider, one client per connection, authenticated with
    # private_key_jwt, and each stand-in accepted its own.
    assert set(stack.processes) == {"casework-review-producer", "messaging", "coordinator"}
    answers = provider.token_answers()
    for client_id in stack.summary["connectionClients"]:
        assert answers[client_id].get(200, 0) >= 1, client_id
        assert set(answers[client_id]) == {200}, client_id
    assert provider.requests()["GET /jwks"] >= 1
    operator = stack.caller_token("operator")
    inspection = httpx.get(
        f"{stack.url}/v1/runs/{final['runId']}/inspection", headers=flow.auth(operator)
    )
    assert inspection.status_code == 200, inspection.text
    calls = [step for step in inspection.json()["steps"] if step["type"] == "call"]
    assert [step["state"] for step in calls] == ["completed", "completed"]


@flow_test
def test_a_token_asked_for_without_a_resource_is_opaque_and_refused(flow: Flow) -> None:
    stack, provider = flow.stack, flow.provider
    client_id = stack.summary["producerClientId"]
    answer = provider.token_request(client_id, stack.caller_secrets[client_id])
    assert answer.status_code == 200, answer.text
    opaque = answer.json()["access_token"]
    assert opaque.count(".") == 0  # not a JWT: the provider's reference token

    refused = flow.start(opaque, "oidc-opaque-1", "APP-9002")

    assert refused.status_code == 401
    assert refused.json()["code"] == "authentication.refused"
    assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert opaque not in refused.text


@flow_test
def test_the_provider_refuses_unknown_resources_and_clients(flow: Flow) -> None:
    stack, provider = flow.stack, flow.provider
    client_id = stack.summary["producerClientId"]
    secret = stack.caller_secrets[client_id]
    messaging = stack.product_urls["messaging"]

    unknown = provider.token_request(client_id, secret, resource="http://127.0.0.1:1/other")
    not_its_own = provider.token_request(client_id, secret, resource=messaging)
    stranger = provider.token_request("nobody", secret, resource=stack.url)
    wrong_secret = provider.token_request(client_id, "x" + secret, resource=stack.url)

    assert (unknown.status_code, unknown.json()["error"]) == (400, "invalid_target")
    assert (not_its_own.status_code, not_its_own.json()["error"]) == (400, "invalid_target")
    assert (stranger.status_code, stranger.json()["error"]) == (401, "invalid_client")
    assert (wrong_secret.status_code, wrong_secret.json()["error"]) == (401, "invalid_client")


async def _connection_token(runtime_file: Path, connection: str, assertion_audience: str) -> str:
    """A token for ``connection`` through the coordinator's own token client."""
    config = load_runtime_file(runtime_file)
    settings = config.connections[connection]
    jwk = resolver_for(config).read_jwk(settings.authorization.signing_key_ref)
    http = ProductHttp()
    try:
        discovery = IssuerDiscovery(http, config.deployment.authentication.issuer)
        client = TokenClient(http, discovery, credentials_for(settings, jwk, assertion_audience))
        return await client.token()
    finally:
        await http.close()


@flow_test
def test_fapi_2_profile_the_assertion_names_the_issuer(flow: Flow) -> None:
    """The flow's last test: it leaves the provider on its FAPI 2.0 profile and the
    coordinator on ``clientAssertionAudience: issuer``."""
    stack, provider = flow.stack, flow.provider
    stack.stop_process("coordinator")
    provider.restart(client_assertion_audience="issuer")
    runtime_file = stack.runtime_file

    # The profile is on: the token endpoint URL (RFC 7523's audience) is refused as `aud`,
    # the issuer identifier is taken.
    with pytest.raises(TokenUnavailable) as refused:
        asyncio.run(_connection_token(runtime_file, "notices", "token-endpoint"))
    assert refused.value.error == "invalid_client"
    token = asyncio.run(_connection_token(runtime_file, "notices", "issuer"))
    assert (
        jwt.decode(token, options={"verify_signature": False})["aud"]
        == (stack.product_urls["messaging"])
    )

    text = runtime_file.read_text("utf-8")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    document = yaml.safe_load(text)
    document["deployment"]["authentication"]["clientAssertionAudience"] = "issuer"
    runtime_file.write_text(header + yaml.safe_dump(document, sort_keys=False), "utf-8")
    stack.start_coordinator()
    sent_before = flow.messages_sent()

    final = flow.run_to_the_end("oidc-fapi-1", "APP-9003")

    assert (final["state"], final["outcome"]) == ("succeeded", "approved")
    assert flow.messages_sent() == sent_before + 1


# ------------------------------------------------------------------ every algorithm allowed

CALLER = "alg-caller"
CALLER_SECRET = "alg-caller-secret-for-a-throwaway-provider"
AUDIENCE = "http://127.0.0.1:9/coordinator"
# RS256 first: the provider's default key.
ALGORITHMS = ["RS256", *sorted(SUPPORTED_ALGORITHMS - {"RS256"})]


def _signing_key(alg: str) -> dict[str, Any]:
    """A private JWK for ``alg``, labelled with it."""
    curves = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}
    if alg in curves:
        jwk = ECAlgorithm.to_jwk(ec.generate_private_key(curves[alg]), as_dict=True)
    elif alg == "EdDSA":
        jwk = OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate(), as_dict=True)
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = RSAAlgorithm.to_jwk(key, as_dict=True)
    return {**jwk, "kid": f"key-{alg.lower()}", "alg": alg, "use": "sig"}


@pytest.fixture(scope="module")
def every_algorithm(
    oidc_providers: OidcProviders, tmp_path_factory: pytest.TempPathFactory
) -> OidcProvider:
    """A provider with a key for each algorithm the gateway may allow and one resource per
    algorithm, every resource's tokens naming :data:`AUDIENCE`."""
    resources = [
        Resource(f"{AUDIENCE}/{alg.lower()}", AUDIENCE, (), (CALLER,), alg=alg)
        for alg in ALGORITHMS
    ]
    return oidc_providers.start(
        tmp_path_factory.mktemp("oidc-algorithms"),
        issuer=f"http://127.0.0.1:{free_port()}",
        clients=[Client(CALLER, secret=CALLER_SECRET)],
        resources=resources,
        signing_jwks=[_signing_key(alg) for alg in ALGORITHMS],
    )


async def _gateway_verifies(provider: OidcProvider, token: str, alg: str) -> VerifiedToken:
    async with httpx.AsyncClient() as client:
        verifier = TokenVerifier(
            issuer=provider.issuer,
            audience=AUDIENCE,
            algorithms=[alg],
            clock_skew_seconds=60,
            source=HttpJwksSource(provider.jwks_uri, client),
        )
        return await verifier.verify_authorization(f"Bearer {token}")


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_the_gateway_verifies_the_providers_tokens_in_every_algorithm_it_allows(
    every_algorithm: OidcProvider, alg: str
) -> None:
    token = every_algorithm.access_token(CALLER, resource=f"{AUDIENCE}/{alg.lower()}")
    assert jwt.get_unverified_header(token)["alg"] == alg

    verified = asyncio.run(_gateway_verifies(every_algorithm, token, alg))

    assert (verified.client_id, verified.sub) == (CALLER, CALLER)
    assert verified.audiences == (AUDIENCE,)


# ------------------------------------------------------------------ the pins


def test_the_provider_is_pinned_exactly_and_every_package_is_integrity_checked(
    oidc_provider_modules: Path, tmp_path: Path
) -> None:
    check_pins()
    assert oidc_provider_modules == modules_dir() and is_installed()
    installed = json.loads((oidc_provider_modules / "oidc-provider" / "package.json").read_text())
    assert installed["version"] == VERSION

    # A range instead of the exact version, or a package without its integrity, is refused.
    ranged, unchecked = tmp_path / "ranged", tmp_path / "unchecked"
    for folder in (ranged, unchecked):
        shutil.copytree(SOURCE_DIR, folder)
    manifest = json.loads((ranged / "package.json").read_text())
    manifest["dependencies"]["oidc-provider"] = f"^{VERSION}"
    (ranged / "package.json").write_text(json.dumps(manifest))
    lock = json.loads((unchecked / "package-lock.json").read_text())
    del lock["packages"]["node_modules/jose"]["integrity"]
    (unchecked / "package-lock.json").write_text(json.dumps(lock))
    with pytest.raises(ProviderError, match="pinned to exactly"):
        check_pins(ranged)
    with pytest.raises(ProviderError, match="no sha512 integrity"):
        check_pins(unchecked)
    # Another lock is another install: the one in the cache is not taken for it.
    assert not is_installed(source=unchecked)


def test_a_provider_that_cannot_listen_fails_its_start_with_its_own_words(
    oidc_provider_modules: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ProviderError, match="did not start") as failed:
            OidcProvider.start(
                tmp_path / "provider",
                issuer=f"http://127.0.0.1:{port}",
                clients=[Client(CALLER, secret=CALLER_SECRET)],
                resources=[],
                modules=oidc_provider_modules,
            )
    assert f"cannot listen on 127.0.0.1:{port}: EADDRINUSE" in str(failed.value)
