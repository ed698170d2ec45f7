"""A PostgreSQL pair under Patroni, with etcd, each on a "host" of its own (tests/ha).

Every host is a network namespace with one address on 10.77.0.0/24. They meet on a bridge
that lives in a namespace of its own (``rcha-sw``), so nothing of this host's own firewall
(a container engine's FORWARD policy, say) stands between them, and no namespace has a
route anywhere else: traffic goes only between addresses this module assigned. The test
process itself joins the bridge at 10.77.0.1 to drive and watch. Cutting a host is setting
its port on the bridge down.

The servers are the complete PostgreSQL 17.10 build, under Patroni 4.1.5 from
``make ha-host``, run as the harness's unprivileged OS user (PostgreSQL refuses root),
with TLS on for clients and for replication, certificates from one private CA, and
synchronous replication (``synchronous_mode``) unless a test asks for asynchronous.
Root only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from devstack.ha_host import HaTools, ensure_ha_tools
from devstack.postgres import OsUser, ensure_os_user
from devstack.postgres_tls import CertificateAuthority

SWITCH: Final = "rcha-sw"
SUBNET: Final = "10.77.0"
WATCHER: Final = f"{SUBNET}.1"
ETCD_ADDRESS: Final = f"{SUBNET}.2"
SUPERUSER_PASSWORD: Final = "ha-superuser-secret"
REPLICATION_PASSWORD: Final = "ha-replication-secret"
ASYNC_MAXIMUM_LAG: Final = 1_048_576
"""``maximum_lag_on_failover`` without synchronous replication (Patroni's default): a
standby further behind than this, as last recorded, is never promoted."""
GUARD_SECONDS: Final = 90.0
"""A bound on every wait for the cluster; it decides nothing."""


class HaError(RuntimeError):
    """The cluster did not do what a test waited for within the bound."""


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


@dataclass
class Host:
    """One network namespace with one address."""

    name: str
    address: str

    @property
    def namespace(self) -> str:
        return f"rcha-{self.name}"

    @property
    def port(self) -> str:
        """Its port on the bridge, in the switch namespace."""
        return f"p-{self.name}"

    def up(self) -> None:
        _run("ip", "netns", "add", self.namespace)
        _run(
            "ip", "link", "add", self.port, "netns", SWITCH, "type", "veth",
            "peer", "name", "eth0", "netns", self.namespace,
        )  # fmt: skip
        _run("ip", "-n", SWITCH, "link", "set", self.port, "master", "br0", "up")
        _run("ip", "-n", self.namespace, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _run("ip", "-n", self.namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", self.namespace, "link", "set", "lo", "up")

    def cut(self) -> None:
        """Its link goes down: nothing reaches it, nothing leaves it."""
        _run("ip", "-n", SWITCH, "link", "set", self.port, "down")

    def mend(self) -> None:
        _run("ip", "-n", SWITCH, "link", "set", self.port, "up")

    def command(self, *args: str, user: OsUser | None = None) -> list[str]:
        """``args`` run inside this host (as ``user`` when given)."""
        prefix = ["ip", "netns", "exec", self.namespace]
        if user is not None:
            prefix += ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
        return [*prefix, *args]


@dataclass
class Node:
    """One PostgreSQL server and its Patroni."""

    host: Host
    data_dir: Path
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def api(self) -> str:
        return f"http://{self.host.address}:8008"

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        return None


@dataclass
class HaCluster:
    """etcd and two Patroni nodes, started by :func:`ha_cluster`."""

    tools: HaTools
    folder: Path
    ca: CertificateAuthority
    user: OsUser
    etcd: Host
    nodes: list[Node]
    synchronous: bool
    hosts: list[Host]
    """Every host on the bridge (torn down on exit), the servers' and etcd's included."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add_host(self, name: str, last_octet: int) -> Host:
        """One more host on the bridge, at ``10.77.0.<last_octet>``, for the coordinator's
        components or the product stand-ins."""
        host = Host(name, f"{SUBNET}.{last_octet}")
        self.hosts.append(host)
        host.up()
        return host

    # -- asking Patroni -----------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """The cluster's members as Patroni answers them (any node that answers)."""
        for node in self.nodes:
            address = f"{node.api}/cluster"  # the test's own address on its own bridge
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(address, timeout=2) as answer,  # noqa: S310
            ):
                members: list[dict[str, Any]] = json.load(answer)["members"]
                return members
        return []

    def role_of(self, name: str) -> str | None:
        for member in self.members():
            if member["name"] == name:
                return str(member["role"])
        return None

    def leader(self) -> Node | None:
        for member in self.members():
            if member["role"] == "leader" and member.get("state") == "running":
                return self.node(member["name"])
        return None

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def wait_for(self, what: str, check: Callable[[], bool]) -> float:
        """Poll ``check`` until it holds; answers the seconds it took (HaError past the
        bound)."""
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > GUARD_SECONDS:
                raise HaError(f"{what}: not within {GUARD_SECONDS:.0f} s\n{self.logs()}")
            time.sleep(0.2)
        return time.monotonic() - began

    def healthy_pair(self) -> bool:
        """One running leader and a streaming replica (synchronous when asked for)."""
        roles = {m["name"]: (m["role"], m.get("state")) for m in self.members()}
        wanted = "sync_standby" if self.synchronous else "replica"
        return sorted(
            role for role, state in roles.values() if state in ("running", "streaming")
        ) == sorted(["leader", wanted])

    def standby_promotable(self) -> bool:
        """Every replica's lag, as Patroni last recorded it, is known and below
        :data:`ASYNC_MAXIMUM_LAG`: a failover may promote it now. (A drill waits for this
        before its fault: right after the deployment is applied, the standby may still be
        replaying it.)"""
        lags = [m.get("lag") for m in self.members() if m["role"] != "leader"]
        return bool(lags) and all(isinstance(lag, int) and lag < ASYNC_MAXIMUM_LAG for lag in lags)

    def url(self, node: Node | None = None, *, database: str = "postgres") -> str:
        """A superuser URL for one node, or for both in order (libpq's form)."""
        hosts = ",".join(f"{n.host.address}:5432" for n in ([node] if node else self.nodes))
        return (
            f"postgresql://postgres:{SUPERUSER_PASSWORD}@{hosts}/{database}"
            "?sslmode=verify-full&target_session_attrs=read-write"
        )

    def logs(self) -> str:
        parts = []
        for node in self.nodes:
            with contextlib.suppress(OSError):
                parts.append(f"--- {node.name}\n" + node.log.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    # -- faults ---------------------------------------------------------------------------

    def kill_node(self, node: Node) -> None:
        """kill -9 of the node's Patroni and its postmaster, as a machine's loss does."""
        postmaster = node.postmaster_pid()
        assert node.process is not None
        os.kill(node.process.pid, signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(postmaster), signal.SIGKILL)
        node.process.wait(timeout=10)
        # The server's own children die with the postmaster gone; none may write on.
        self.wait_for(f"{node.name}'s server gone", lambda: not _running(postmaster))

    def switchover(self, leader: Node, candidate: Node) -> None:
        """A planned switchover with ``patronictl``, run on the leader's host."""
        subprocess.run(
            leader.host.command(
                str(self.tools.patronictl),
                "-c",
                str(leader.config),
                "switchover",
                "--leader",
                leader.name,
                "--candidate",
                candidate.name,
                "--force",
            ),
            check=True,
            capture_output=True,
            text=True,
        )

    def start_node(self, node: Node) -> None:
        with node.log.open("ab") as log:
            node.process = subprocess.Popen(
                node.host.command(str(self.tools.patroni), str(node.config), user=self.user),
                env={
                    **os.environ,
                    # libpq looks for a client certificate under $HOME: the node's own
                    # folder, never root's.
                    "HOME": str(node.data_dir.parent),
                    # The build's libraries look for libpq in /opt/postgresql/lib; without
                    # this the walreceiver would load the system's older libpq.
                    "LD_LIBRARY_PATH": str(self.tools.postgres_bin.parent / "lib"),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(node.process)


def _running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def _tear_down_network(hosts: list[Host]) -> None:
    for host in hosts:
        subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", "rcha-watch"], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", SWITCH], capture_output=True, check=False)


def _node_config(
    cluster_folder: Path, node: Node, tools: HaTools, synchronous: bool
) -> dict[str, Any]:
    tls = cluster_folder / "tls"
    return {
        "scope": "rcha",
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"{node.host.address}:8008",
            "connect_address": f"{node.host.address}:8008",
        },
        "etcd3": {"hosts": f"{ETCD_ADDRESS}:2379"},
        "bootstrap": {
            "dcs": {
                "ttl": 20,
                "loop_wait": 2,
                "retry_timeout": 5,
                "maximum_lag_on_failover": 0 if synchronous else ASYNC_MAXIMUM_LAG,
                "synchronous_mode": synchronous,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "max_connections": 100,
                        "ssl": "on",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, "data-checksums", {"auth": "scram-sha-256"}],
        },
        "postgresql": {
            "listen": f"{node.host.address}:5432",
            "connect_address": f"{node.host.address}:5432",
            "data_dir": str(node.data_dir),
            "bin_dir": str(tools.postgres_bin),
            "pgpass": str(node.data_dir.parent / f"{node.name}.pgpass"),
            "authentication": {
                "superuser": {
                    "username": "postgres",
                    "password": SUPERUSER_PASSWORD,
                    "sslmode": "verify-ca",
                    "sslrootcert": str(tls / "ca.crt"),
                },
                "replication": {
                    "username": "replicator",
                    "password": REPLICATION_PASSWORD,
                    "sslmode": "verify-ca",
                    "sslrootcert": str(tls / "ca.crt"),
                },
                "rewind": {
                    "username": "postgres",
                    "password": SUPERUSER_PASSWORD,
                    "sslmode": "verify-ca",
                    "sslrootcert": str(tls / "ca.crt"),
                },
            },
            # Each node's own: the dcs section above is one for the whole cluster.
            "parameters": {
                "unix_socket_directories": str(node.data_dir.parent / f"{node.name}-socket"),
                "ssl_cert_file": str(tls / f"{node.name}.crt"),
                "ssl_key_file": str(tls / f"{node.name}.key"),
                "ssl_ca_file": str(tls / "ca.crt"),
            },
            "pg_hba": [
                "local all all trust",
                f"hostssl all all {SUBNET}.0/24 scram-sha-256",
                f"hostssl replication replicator {SUBNET}.0/24 scram-sha-256",
            ],
        },
    }


@contextlib.contextmanager
def ha_cluster(*, synchronous: bool = True) -> Iterator[HaCluster]:
    """etcd and a Patroni pair on hosts of their own, torn down on exit."""
    tools = ensure_ha_tools()
    user = ensure_os_user()
    etcd = Host("etcd", ETCD_ADDRESS)
    hosts = [etcd, Host("db1", f"{SUBNET}.11"), Host("db2", f"{SUBNET}.12")]
    _tear_down_network(hosts)  # what a killed earlier run left
    with contextlib.suppress(OSError):
        for stale in Path("/run/netns").glob("rcha-*"):
            subprocess.run(["ip", "netns", "del", stale.name], capture_output=True, check=False)
    folder = Path(tempfile.mkdtemp(prefix="rcha-", dir="/dev/shm"))
    folder.chmod(0o755)
    cluster: HaCluster | None = None
    try:
        _run("ip", "netns", "add", SWITCH)
        _run("ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", SWITCH, "link", "set", "br0", "up")
        _run(
            "ip", "link", "add", "rcha-watch", "type", "veth",
            "peer", "name", "p-watch", "netns", SWITCH,
        )  # fmt: skip
        _run("ip", "-n", SWITCH, "link", "set", "p-watch", "master", "br0", "up")
        _run("ip", "addr", "add", f"{WATCHER}/24", "dev", "rcha-watch")
        _run("ip", "link", "set", "rcha-watch", "up")
        for host in list(hosts):
            host.up()

        ca = CertificateAuthority.create("rcha test CA")
        tls = folder / "tls"
        tls.mkdir()
        (tls / "ca.crt").write_bytes(ca.pem)
        nodes = []
        for host in hosts[1:]:
            cert, key = ca.issue_server((host.address,), client_auth=True)
            (tls / f"{host.name}.crt").write_bytes(cert)
            (tls / f"{host.name}.key").write_bytes(key)
            nodes.append(
                Node(
                    host,
                    data_dir=folder / host.name / "data",
                    config=folder / f"{host.name}.yml",
                    log=folder / f"{host.name}.log",
                )
            )
        cluster = HaCluster(tools, folder, ca, user, etcd, nodes, synchronous, hosts)
        for node in nodes:
            node.data_dir.parent.mkdir()
            node.config.write_text(yaml.safe_dump(_node_config(folder, node, tools, synchronous)))
        for path in [tls, *tls.iterdir(), *(n.data_dir.parent for n in nodes)]:
            os.chown(path, user.uid, user.gid)
            path.chmod(0o700 if path.is_dir() else 0o600)
        tls.chmod(0o755)
        (tls / "ca.crt").chmod(0o644)

        etcd_flags = {
            "name": "etcd",
            "data-dir": str(folder / "etcd"),
            "listen-client-urls": f"http://{ETCD_ADDRESS}:2379",
            "advertise-client-urls": f"http://{ETCD_ADDRESS}:2379",
            "listen-peer-urls": f"http://{ETCD_ADDRESS}:2380",
            "initial-advertise-peer-urls": f"http://{ETCD_ADDRESS}:2380",
            "initial-cluster": f"etcd=http://{ETCD_ADDRESS}:2380",
        }
        arguments = [f"--{flag}={value}" for flag, value in etcd_flags.items()]
        with (folder / "etcd.log").open("ab") as etcd_log:
            cluster.processes.append(
                subprocess.Popen(
                    etcd.command(str(tools.etcd), *arguments),
                    stdout=etcd_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        for node in nodes:
            cluster.start_node(node)
        cluster.wait_for("a leader and its standby", cluster.healthy_pair)
        yield cluster
    finally:
        if cluster is not None:
            for process in cluster.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            for node in cluster.nodes:
                pid = node.postmaster_pid()
                if _running(pid):
                    assert pid is not None
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        _tear_down_network(hosts)
        shutil.rmtree(folder, ignore_errors=True)
