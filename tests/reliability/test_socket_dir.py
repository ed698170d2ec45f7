"""The internal socket folder is judged before it is touched.

A folder of another user, a symbolic link or a file where ``deployment.internal.socketDir``
(or the default folder) should be is one ``deployment.refused`` line naming that key, and
the folder is left as it was. Giving a folder to another user needs root; those cases are
skipped, with the reason, when the suite runs as anyone else.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.codes import Code
from core.config import load_runtime_file
from core.config.model import RuntimeConfig
from core.errors import CoordinatorError
from core.rpc.transport import default_socket_dir, prepare_socket_folder
from tests.helpers.runtime_files import complete_runtime, write_runtime


def socket_folder(config: RuntimeConfig) -> Path | None:
    """The folder of the internal Unix sockets, made ready as the transport makes it
    (:func:`prepare_socket_folder`): ``deployment.internal.socketDir`` or the default
    folder; None with TCP addresses."""
    internal = config.deployment.internal
    if internal is None:
        return prepare_socket_folder(default_socket_dir(config.namespace))
    if internal.socket_dir is None:
        return None
    return prepare_socket_folder(internal.socket_dir)


COORDINATOR = str(Path(sys.executable).with_name("coordinator"))
NOBODY = 65534
KEY = "deployment.internal.socketDir"
INTERNAL = ("admission", "recovery", "auditd")

# A fresh interpreter started by root that gives up root before it runs the launcher: the
# view of a coordinator run by user 65534. It cannot be executed as that user from the start
# (the interpreter and its standard library live under /root, which only root may open), so
# it first loads what the launcher needs on its way to the refusal, and the codec a package
# check sorts manifest keys by; after that it can load nothing new. Started afresh, never
# forked from this process: a fork after gRPC was used here hangs in gRPC.
AS_NOBODY = f"""
import os, sys
import core.config, core.db.roles, core.db.statements, core.deploy.activation
import core.deploy.database, core.listen, core.runtime
from core import launcher
"".encode("utf-16be")
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
launcher.main(sys.argv[1:])
"""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving a folder to another user (os.chown) needs root"
)


@pytest.fixture
def tree() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are root's 0700 folders, which the non-root
    # coordinator below could not walk through to its own runtime file.
    base = Path(tempfile.mkdtemp(prefix="socket-dir-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def runtime_file(base: Path, folder: Path) -> Path:
    document = complete_runtime(base)
    document["deployment"]["internal"] = {"socketDir": str(folder)}
    return write_runtime(base / "runtime.yaml", document)


def owner_and_mode(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


@needs_root
@pytest.mark.parametrize("mode", [[], ["--component", "gateway"]], ids=["all-in-one", "component"])
def test_a_folder_of_another_user_refuses_the_start_and_is_left_as_it_was(
    tree: Path, mode: list[str]
) -> None:
    folder = tree / "sockets"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    folder.chmod(0o755)
    result = subprocess.run(
        [COORDINATOR, "--runtime-config", str(runtime_file(tree, folder)), *mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"deployment.refused: {KEY}: "), lines[0]
    assert "another user" in lines[0]
    assert owner_and_mode(folder) == (NOBODY, 0o755)


@needs_root
def test_a_coordinator_not_run_by_root_refuses_a_folder_it_does_not_own(tree: Path) -> None:
    runtime = runtime_file(tree, tree / "sockets")
    for place, folders, files in os.walk(tree):
        for name in [place, *(os.path.join(place, f) for f in folders + files)]:
            os.lchown(name, NOBODY, NOBODY)
    folder = tree / "sockets"
    folder.mkdir()  # root's: another user's, seen from the coordinator
    folder.chmod(0o755)
    result = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, "--runtime-config", str(runtime)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"deployment.refused: {KEY}: "), lines[0]
    assert "another user" in lines[0]
    assert owner_and_mode(folder) == (0, 0o755)


def refusal(folder: Path) -> str:
    with pytest.raises(CoordinatorError) as caught:
        prepare_socket_folder(folder)
    assert caught.value.code is Code.DEPLOYMENT_REFUSED
    assert caught.value.detail.startswith(f"{KEY}: {folder} ")
    return caught.value.detail


@needs_root
def test_the_owner_is_judged_before_the_mode_is_set(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    folder.chmod(0o755)
    assert "belongs to another user" in refusal(folder)
    assert owner_and_mode(folder) == (NOBODY, 0o755)


def test_a_symbolic_link_is_refused_even_to_a_folder_of_ours(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = tmp_path / "sockets"
    link.symlink_to(target)
    assert "symbolic link" in refusal(link)
    assert owner_and_mode(target) == (os.geteuid(), 0o755)


def test_a_dangling_symbolic_link_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    link = tmp_path / "sockets"
    link.symlink_to(tmp_path / "elsewhere")
    assert "symbolic link" in refusal(link)
    assert not (tmp_path / "elsewhere").exists()


def test_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "sockets"
    file.write_text("")
    assert "is not a folder" in refusal(file)


def test_a_missing_folder_is_created_for_this_user_alone(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "sockets"
    assert prepare_socket_folder(folder) == folder
    assert owner_and_mode(folder) == (os.geteuid(), 0o700)


def test_a_folder_of_ours_is_closed_to_everyone_else(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir()
    folder.chmod(0o775)
    assert prepare_socket_folder(folder) == folder
    assert owner_and_mode(folder) == (os.geteuid(), 0o700)


def test_the_default_folder_is_judged_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = complete_runtime(tmp_path)
    del document["deployment"]["internal"]
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    default = tmp_path / "xdg" / "registry-coordinator" / config.namespace
    default.parent.mkdir(parents=True)
    default.symlink_to(tmp_path)
    with pytest.raises(CoordinatorError) as caught:
        socket_folder(config)
    assert caught.value.detail.startswith(f"{KEY}: {default} is a symbolic link")
    default.unlink()
    assert socket_folder(config) == default
    assert owner_and_mode(default) == (os.geteuid(), 0o700)


def test_tcp_addresses_have_no_socket_folder(tmp_path: Path) -> None:
    document = complete_runtime(tmp_path)
    document["deployment"]["internal"] = {
        "addresses": {name: f"127.0.0.1:{7101 + n}" for n, name in enumerate(INTERNAL)},
        "tls": {
            "certificateRef": "secret:file/internal.crt",
            "privateKeyRef": "secret:file/internal.key",
            "trustedRootCertificateRef": "secret:file/internal-root.pem",
        },
    }
    config = load_runtime_file(write_runtime(tmp_path / "runtime.yaml", document))
    assert socket_folder(config) is None
