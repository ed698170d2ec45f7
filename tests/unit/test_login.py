"""``coordinatorctl login``'s protocol edges, against a scripted issuer (httpx's mock
transport): the answers a certified provider rarely gives on demand — ``slow_down``, a
code that expires, a token of the wrong shape, discovery naming another issuer. The whole
flow against the real provider, with a browser, is tests/console/test_login.py."""

from __future__ import annotations

import base64
import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from cli import login
from core.errors import CoordinatorError
from tests.helpers.cli_run import run_cli

ISSUER = "https://issuer.example.org/realms/registry"
AUDIENCE = "https://coordinator.example.org"
DISCOVERY = {
    "issuer": ISSUER,
    "token_endpoint": ISSUER + "/token",
    "device_authorization_endpoint": ISSUER + "/device",
}


def _b64(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


def token(header: dict[str, Any] | None = None, **claims: Any) -> str:
    """An unsigned JWT of the given shape (login reads, never verifies)."""
    head = {"alg": "RS256", "typ": "at+jwt", "kid": "k1", **(header or {})}
    body = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "client_id": "ops",
        "exp": 2_000_000_000,
    }
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    return f"{_b64(head)}.{_b64(body)}.c2ln"


class ScriptedIssuer:
    """Answers discovery, then each token request with the next scripted answer."""

    def __init__(
        self, answers: list[tuple[int, dict[str, Any]]], discovery: dict[str, Any]
    ) -> None:
        self.answers = answers
        self.discovery = discovery
        self.forms: list[dict[str, list[str]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/.well-known/openid-configuration"):
            return httpx.Response(200, json=self.discovery)
        self.forms.append(parse_qs(request.content.decode()))
        if request.url == httpx.URL(ISSUER + "/device"):
            return httpx.Response(
                200,
                json={
                    "device_code": "dc",
                    "user_code": "ABCD-EFGH",
                    "verification_uri": ISSUER + "/device",
                    "expires_in": 30,
                    "interval": 2,
                },
            )
        status, body = self.answers.pop(0)
        return httpx.Response(status, json=body)


@pytest.fixture
def issuer() -> Iterator[Callable[..., tuple[httpx.Client, ScriptedIssuer]]]:
    made: list[httpx.Client] = []

    def make(
        *answers: tuple[int, dict[str, Any]], discovery: dict[str, Any] | None = None
    ) -> tuple[httpx.Client, ScriptedIssuer]:
        scripted = ScriptedIssuer(list(answers), discovery or DISCOVERY)
        client = httpx.Client(transport=httpx.MockTransport(scripted))
        made.append(client)
        return client, scripted

    yield make
    for client in made:
        client.close()


class Clock:
    """Simulated time: ``sleep`` moves it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def device(http: httpx.Client, clock: Clock) -> login.Tokens:
    flow = login.DeviceLogin(
        login.discover(http, ISSUER), "ops", AUDIENCE, clock=lambda: clock.now, sleep=clock.sleep
    )
    said: list[str] = []
    tokens = flow.run(http, said.append)
    assert said[0] == f"To sign in, open {ISSUER}/device and enter the code ABCD-EFGH"
    return tokens


def test_polls_at_the_issuers_interval_and_backs_off_on_slow_down(issuer: Any) -> None:
    http, scripted = issuer(
        (400, {"error": "authorization_pending"}),
        (400, {"error": "slow_down"}),
        (200, {"access_token": token(), "token_type": "Bearer", "refresh_token": "r1"}),
    )
    clock = Clock()
    tokens = device(http, clock)
    assert clock.slept == [2, 2, 7]
    assert tokens.refresh_token == "r1" and tokens.grant == "device_code"
    assert scripted.forms[0] == {
        "client_id": ["ops"],
        "scope": [login.DEFAULT_SCOPE],
        "resource": [AUDIENCE],
    }
    assert scripted.forms[1]["grant_type"] == [login.DEVICE_CODE_GRANT]
    assert scripted.forms[1]["resource"] == [AUDIENCE]
    assert "dc" not in repr(tokens) and "r1" not in repr(tokens)


def test_stops_polling_when_the_code_expires(issuer: Any) -> None:
    http, _ = issuer(*[(400, {"error": "authorization_pending"})] * 20)
    clock = Clock()
    with pytest.raises(CoordinatorError, match="expired before the sign-in") as refused:
        device(http, clock)
    assert refused.value.code.value == "auth.login-refused"
    assert clock.now <= 30


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("access_denied", "declined"),
        ("expired_token", "expired"),
        ("invalid_client", "invalid_client"),
    ],
)
def test_a_refusal_while_polling_is_named(issuer: Any, error: str, words: str) -> None:
    http, _ = issuer((400, {"error": error, "error_description": "secret detail"}))
    with pytest.raises(CoordinatorError, match=words) as refused:
        device(http, Clock())
    assert "secret detail" not in str(refused.value)


def test_an_unknown_oauth_error_is_not_repeated(issuer: Any) -> None:
    http, _ = issuer((400, {"error": "<script>"}))
    with pytest.raises(CoordinatorError, match="unrecognised") as refused:
        device(http, Clock())
    assert "<script>" not in str(refused.value)


def test_discovery_must_name_the_issuer_exactly(issuer: Any) -> None:
    http, _ = issuer(discovery={**DISCOVERY, "issuer": ISSUER + "/"})
    with pytest.raises(CoordinatorError, match="names the issuer"):
        login.discover(http, ISSUER)


def test_an_issuer_without_the_device_grant_is_named(issuer: Any) -> None:
    plain = {k: v for k, v in DISCOVERY.items() if k != "device_authorization_endpoint"}
    http, _ = issuer(discovery=plain)
    with pytest.raises(CoordinatorError, match="no device authorization endpoint"):
        device(http, Clock())


def test_http_to_another_host_is_refused() -> None:
    with pytest.raises(CoordinatorError, match="https"):
        login.check_url("http://issuer.example.org", "the issuer")
    assert login.check_url("http://127.0.0.1:9", "the issuer") == "http://127.0.0.1:9"


def test_an_expired_refresh_token_falls_back(issuer: Any) -> None:
    http, _ = issuer((400, {"error": "invalid_grant"}))
    assert login.refresh(http, login.discover(http, ISSUER), "ops", AUDIENCE, "old") is None


def test_a_refresh_without_rotation_keeps_the_refresh_token(issuer: Any) -> None:
    http, scripted = issuer((200, {"access_token": token(), "token_type": "bearer"}))
    tokens = login.refresh(http, login.discover(http, ISSUER), "ops", AUDIENCE, "kept")
    assert tokens is not None and tokens.refresh_token == "kept"
    assert scripted.forms[-1]["grant_type"] == ["refresh_token"]


# ------------------------------------------------------------------------- the token's shape


@pytest.mark.parametrize(
    ("access", "words"),
    [
        ("opaque-token", "not a JWT"),
        (token({"typ": "JWT"}), "typ 'JWT'"),
        (token(iss=ISSUER + "/"), "names iss"),
        (token(aud="https://other.example.org"), "not for the audience"),
        (token(client_id=None), "no client_id claim"),
        (token(sub=None, client_id=None), "no sub and no client_id"),
        (token({"alg": "PS256"}), "signed with 'PS256'"),
    ],
)
def test_a_token_the_api_would_refuse_is_refused(access: str, words: str) -> None:
    with pytest.raises(CoordinatorError, match=words):
        login.token_facts(access, ISSUER, AUDIENCE, ("RS256", "ES256"))


def test_a_token_of_the_right_shape_is_described() -> None:
    facts = login.token_facts(
        token({"typ": "application/AT+JWT"}, aud=["x", AUDIENCE]), ISSUER, AUDIENCE
    )
    assert (facts.client_id, facts.subject) == ("ops", "alice")
    assert login.expiry_text(facts.expires_at) == "2033-05-18T03:33:20Z"


# ------------------------------------------------------------------------------ the files


def test_files_are_replaced_atomically_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "ops.token"
    target.write_text("old\n")
    target.chmod(0o644)
    kept = login.store(target, login.Tokens("new-access", "new-refresh", "device_code"))
    assert target.read_text() == "new-access\n"
    assert kept == tmp_path / "ops.token.refresh" and kept.read_text() == "new-refresh\n"
    for path in (target, kept):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert login.stored_refresh_token(target) == "new-refresh"
    # A grant without a refresh token leaves no stale one behind.
    assert login.store(target, login.Tokens("newer", None, "client_credentials")) is None
    assert not kept.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.token"]


def test_a_folder_that_cannot_be_written_is_a_token_file_refusal(tmp_path: Path) -> None:
    with pytest.raises(CoordinatorError) as refused:
        login.write_private(tmp_path / "missing" / "t", "x")
    assert refused.value.code.value == "auth.token-file"


def test_the_private_key_file_follows_the_secret_rules(tmp_path: Path) -> None:
    key = tmp_path / "client.jwk"
    key.write_text("{}")
    key.chmod(0o640)
    with pytest.raises(CoordinatorError, match="grants group or others") as loose:
        login.read_private_jwk(key)
    assert loose.value.code.value == "secret.insecure"
    key.chmod(0o600)
    with pytest.raises(CoordinatorError, match="no kid") as malformed:
        login.read_private_jwk(key)
    assert malformed.value.code.value == "secret.malformed"


# ------------------------------------------------------------------------------ the command


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--token-file", "t", "--issuer", ISSUER, "--audience", AUDIENCE], "--client-id"),
        (["--client-id", "ops", "--issuer", ISSUER, "--audience", AUDIENCE], "--token-file"),
        (["--client-id", "ops", "--token-file", "t", "--audience", AUDIENCE], "--issuer"),
        (
            ["--client-id", "ops", "--token-file", "t", "--device", "--private-key-file", "k"],
            "exclude each other",
        ),
    ],
)
def test_missing_or_clashing_options_are_usage_errors(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    for name in ("COORDINATOR_TOKEN_FILE", "COORDINATOR_RUNTIME_CONFIG", "COORDINATOR_CLIENT_ID"):
        monkeypatch.delenv(name, raising=False)
    status, _, err = run_cli(["login", *args], capsys)
    assert status == 2
    assert words in err


def test_a_person_who_names_both_urls_needs_no_runtime_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    # An unreadable runtime file named by the environment, as on an operator's own account:
    # with --issuer and --audience given it is never opened (the issuer, unreachable here,
    # is what refuses).
    monkeypatch.setenv("COORDINATOR_RUNTIME_CONFIG", str(tmp_path / "missing.yaml"))
    status, _, err = run_cli(
        [
            "login",
            "--client-id",
            "ops",
            "--token-file",
            str(tmp_path / "t"),
            "--issuer",
            "http://127.0.0.1:9",
            "--audience",
            AUDIENCE,
        ],
        capsys,
    )
    assert status == 1
    assert err.strip().splitlines()[-1] == (
        "coordinator.auth.login-refused: cannot reach the issuer at http://127.0.0.1:9"
    )
