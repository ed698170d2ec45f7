"""``coordinatorctl login`` against the real OpenID provider, its tokens used on the real API.

One stack whose issuer is panva's ``oidc-provider`` (pinned, see ``devstack.oidc_provider``)
instead of the development issuer. The runtime file's operator client is registered there
as a public client of the device authorization grant, its producer client as a
``private_key_jwt`` client with a key only this test holds. ``coordinatorctl`` runs as a
separate process, as an operator runs it:

- the device flow is driven as a person would: the command prints the verification URL and
  the code on standard error; the browser opens the URL, types the code, confirms it, signs
  in and approves; the command, polling meanwhile, writes the token file and the refresh
  token beside it, both 0600, and ``doctor`` and ``list`` work with the token;
- the next ``login`` spends the refresh token and asks nobody; ``--device`` asks again;
- a person who cancels on the sign-in page gets ``coordinator.auth.login-refused`` and no file;
- automation: ``--private-key-file`` with the client's private JWK gets a token for the
  producer, which starts a run; a key file others may read is refused before anything is sent;
- the retention unit's own two command lines (deploy/systemd/registry-coordinator-retain.service),
  run as systemd would with its environment, log in as a retention client and call ``retain``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Browser, Page

from core.config.check import check_runtime_file
from core.deploy import apply
from core.workflow.package import build_package
from devstack.issuer import generate_private_jwk
from devstack.oidc_provider import Client, OidcProvider, ProviderStack, ensure_installed
from devstack.postgres import PostgresCluster
from tests.deploy.test_systemd_units import read_unit

ROOT = Path(__file__).resolve().parents[2]
CTL = Path(sys.executable).with_name("coordinatorctl")
PROMPT = re.compile(r"open (?P<url>\S+) and enter the code (?P<code>\S+)")
RETENTION = "retention-job"
_sites = itertools.count(1)
SIGN_IN_SECONDS = 60.0
"""The bound on a command waiting for the browser's steps (it polls every 5 s)."""


@dataclass
class Site:
    stack: ProviderStack
    provider: OidcProvider
    producer_key: Path
    retention_key: Path
    workdir: Path
    running: list[subprocess.Popen[str]]

    @property
    def operator(self) -> str:
        return str(self.stack.summary["operatorClientId"])

    @property
    def producer(self) -> str:
        return str(self.stack.summary["producerClientId"])

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CTL), "--runtime-config", str(self.stack.runtime_file), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
        )

    def start_login(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(CTL), "--runtime-config", str(self.stack.runtime_file), "login", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        self.running.append(process)
        return process


def _env() -> dict[str, str]:
    # The test's own settings must not stand in for the options given here.
    names = ("COORDINATOR_URL", "COORDINATOR_TOKEN_FILE", "COORDINATOR_RUNTIME_CONFIG")
    return {k: v for k, v in os.environ.items() if k not in names}


@pytest.fixture(scope="module")
def site(
    postgres_server: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("login")
    # Module fixtures may be set up twice in one session: pytest groups the browser tests of
    # every module together, so this module's others come after another module's.
    name = f"coordinator_login_{os.getpid()}_{next(_sites)}"
    database = postgres_server.create_database(name)
    built = build_package(ROOT / "examples" / "approval-notice", root / "packages")
    stack = ProviderStack.prepare(
        root / "stack", packages=[(built.path, built.digest)], database=database
    )
    try:
        # A client of its own for the retention job, allowed that one action.
        runtime = yaml.safe_load(stack.runtime_file.read_text())
        runtime["deployment"]["authentication"]["policies"][RETENTION] = {
            "operator": True,
            "actions": ["retain"],
        }
        stack.runtime_file.write_text(yaml.safe_dump(runtime, sort_keys=False))
        clients, resources = stack.registrations()
        operator = stack.summary["operatorClientId"]
        producer = stack.summary["producerClientId"]
        producer_jwk = generate_private_jwk("ES256")
        by_id = {client.client_id: client for client in clients}
        by_id[operator] = Client(operator, public=True)
        by_id[producer] = Client(producer, jwks={"keys": [producer_jwk]})
        retention_jwk = generate_private_jwk("RS256")
        by_id[RETENTION] = Client(RETENTION, jwks={"keys": [retention_jwk]})
        key_file, retention_key = root / "producer.jwk", root / "retain-client.jwk"
        for path, jwk in ((key_file, producer_jwk), (retention_key, retention_jwk)):
            path.write_text(json.dumps(jwk))
            path.chmod(0o600)
        for resource in resources:
            if resource.resource == stack.url:
                resources[resources.index(resource)] = replace(
                    resource, clients=(*resource.clients, RETENTION)
                )
        stack.provider = OidcProvider.start(
            root / "provider",
            issuer=stack.summary["issuer"],
            clients=list(by_id.values()),
            resources=resources,
            modules=ensure_installed(),
        )
        stack.start_products()
        asyncio.run(apply(check_runtime_file(stack.runtime_file), []))
        stack.start_coordinator()
        yield Site(stack, stack.provider, key_file, retention_key, root, [])
    finally:
        if stack.provider is not None:
            stack.provider.stop()
        stack.stop()
        postgres_server.drop_database(name)


@pytest.fixture(autouse=True)
def _no_login_left(site: Site) -> Iterator[None]:
    """A login a failed test left waiting is killed, not left polling."""
    yield
    while site.running:
        process = site.running.pop()
        if process.poll() is None:
            process.kill()
        process.communicate()


def _prompt(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Read the command's standard error up to the line naming the URL and the code."""
    assert process.stderr is not None
    seen: list[str] = []
    for line in process.stderr:
        seen.append(line)
        found = PROMPT.search(line)
        if found:
            return found["url"], found["code"]
    process.wait(timeout=10)
    raise AssertionError(f"login printed no verification URL and code: {''.join(seen)!r}")


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=SIGN_IN_SECONDS)
    return process.returncode, out, err


def _sign_in(page: Page, url: str, code: str, *, approve: bool = True) -> None:
    """What a person does in the browser: the issuer's code, confirm, login and consent
    pages of the provider."""
    page.goto(url)
    page.fill("input[name=user_code]", code)
    page.get_by_role("button", name="Continue").click()
    page.get_by_text(code).wait_for()  # the confirmation page shows the code again
    page.get_by_role("button", name="Continue").click()
    page.fill("input[name=login]", "operator.alice")
    if not approve:
        page.get_by_role("link", name="[ Cancel ]").click()
        page.wait_for_load_state()
        return
    page.fill("input[name=password]", "anything")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # the consent page
    page.get_by_text("Sign-in Success").wait_for()


def _owner_only(path: Path) -> bool:
    info = path.stat()
    return stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()


def test_a_person_signs_in_with_the_device_flow_and_the_token_works(site: Site, page: Page) -> None:
    token_file = site.workdir / "alice.token"
    process = site.start_login("--client-id", site.operator, "--token-file", str(token_file))
    url, code = _prompt(process)
    assert url.startswith(site.provider.issuer + "/")
    assert not token_file.exists()  # nothing before the sign-in

    _sign_in(page, url, code)

    status, out, err = _finish(process)
    assert status == 0, err
    assert f"written to {token_file}" in out
    refresh = token_file.with_name("alice.token.refresh")
    assert _owner_only(token_file) and _owner_only(refresh)
    token = token_file.read_text()
    assert token.endswith("\n") and token.count(".") == 2
    assert token.strip() not in out + err and refresh.read_text().strip() not in out + err

    api = ("--url", site.stack.url, "--token-file", str(token_file))
    doctor = site.ctl("doctor", *api, "--output", "json")
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["schemaVersion"] == 4
    listed = site.ctl("list", *api, "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert "runs" in json.loads(listed.stdout)


def test_the_next_login_spends_the_refresh_token_and_device_asks_again(
    site: Site, page: Page, browser: Browser
) -> None:
    token_file = site.workdir / "bob.token"
    first = site.start_login("--client-id", site.operator, "--token-file", str(token_file))
    _sign_in(page, *_prompt(first))
    assert _finish(first)[0] == 0
    before = token_file.read_text()
    tokens_before = site.provider.token_answers()[site.operator].get(200, 0)

    again = site.ctl(
        "login", "--client-id", site.operator, "--token-file", str(token_file), "--output", "json"
    )
    assert again.returncode == 0, again.stderr
    document = json.loads(again.stdout)
    assert document["grant"] == "refresh_token"
    assert document["clientId"] == site.operator
    assert "enter the code" not in again.stderr
    assert token_file.read_text() != before
    assert site.provider.token_answers()[site.operator][200] == tokens_before + 1

    forced = site.start_login(
        "--client-id", site.operator, "--token-file", str(token_file), "--device"
    )
    url, code = _prompt(forced)
    _sign_in(browser.new_context().new_page(), url, code)  # no session left from before
    status, _, err = _finish(forced)
    assert status == 0, err


def test_a_cancelled_sign_in_is_refused_and_writes_nothing(site: Site, page: Page) -> None:
    token_file = site.workdir / "carol.token"
    process = site.start_login("--client-id", site.operator, "--token-file", str(token_file))
    url, code = _prompt(process)
    _sign_in(page, url, code, approve=False)
    status, _, err = _finish(process)
    assert status == 1
    assert err.strip().splitlines()[-1].startswith("coordinator.auth.login-refused:")
    assert "declined" in err
    assert not token_file.exists()
    assert not list(site.workdir.glob(".carol.token*"))  # no temporary file left either


def test_automation_gets_a_token_with_private_key_jwt_and_starts_a_run(
    site: Site, tmp_path: Path
) -> None:
    token_file = tmp_path / "producer.token"
    login = site.ctl(
        "login",
        "--client-id",
        site.producer,
        "--private-key-file",
        str(site.producer_key),
        "--token-file",
        str(token_file),
        "--output",
        "json",
    )
    assert login.returncode == 0, login.stderr
    document = json.loads(login.stdout)
    assert document["grant"] == "client_credentials"
    assert document["refreshTokenFile"] is None
    assert _owner_only(token_file)

    application = tmp_path / "input.json"
    application.write_text(json.dumps({"applicationId": "APP-LOGIN-1", "applicantRef": "person-1"}))
    started = site.ctl(
        "start",
        "--workflow",
        "approval-notice",
        "--input-file",
        str(application),
        "--url",
        site.stack.url,
        "--token-file",
        str(token_file),
        "--output",
        "json",
    )
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["runId"]


def test_a_key_file_others_may_read_is_refused_before_anything_is_sent(
    site: Site, tmp_path: Path
) -> None:
    loose = tmp_path / "loose.jwk"
    loose.write_bytes(site.producer_key.read_bytes())
    loose.chmod(0o644)
    asked = site.provider.token_answers().get(site.producer, {})
    refused = site.ctl(
        "login",
        "--client-id",
        site.producer,
        "--private-key-file",
        str(loose),
        "--token-file",
        str(tmp_path / "t"),
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("coordinator.secret.insecure:")
    assert site.provider.token_answers().get(site.producer, {}) == asked
    assert not (tmp_path / "t").exists()


def test_the_retention_units_commands_log_in_and_retain(site: Site, tmp_path: Path) -> None:
    service = read_unit("registry-coordinator-retain.service")["Service"]
    token_file = tmp_path / "run" / "token"
    token_file.parent.mkdir(mode=0o700)  # what RuntimeDirectory= makes
    installed = {
        "/opt/registry-coordinator/bin/coordinatorctl": str(CTL),
        "/etc/registry-coordinator/secrets/retain-client.jwk": str(site.retention_key),
        "/etc/registry-coordinator/runtime.yaml": str(site.stack.runtime_file),
        "/run/registry-coordinator-retain/token": str(token_file),
    }
    # retain.env, as the README asks the operator to write it.
    environment = {
        **_env(),
        "COORDINATOR_URL": site.stack.url,
        "COORDINATOR_CLIENT_ID": RETENTION,
        "RETAIN_OLDER_THAN": "30d",
    }
    for line in service["Environment"]:
        name, _, value = line.partition("=")
        environment[name] = installed.get(value, value)
    for key in ("ExecStartPre", "ExecStart"):
        [line] = service[key]
        words = [installed.get(word, word) for word in shlex.split(line)]
        words = [
            environment["RETAIN_OLDER_THAN"] if w == "${RETAIN_OLDER_THAN}" else w for w in words
        ]
        done = subprocess.run(
            [*words, "--output", "json"],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
        )
        assert done.returncode == 0, (key, done.stderr)
        document = json.loads(done.stdout)
        if key == "ExecStartPre":
            assert document["clientId"] == RETENTION
            assert document["grant"] == "client_credentials"
            assert _owner_only(token_file)
        else:
            # Nothing ended 30 days ago on a fresh stack: one call, accepted, nothing erased.
            assert (document["erased"], document["calls"]) == (0, 1)
