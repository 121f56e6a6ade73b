"""One server per data directory (service/storage/dir_lock.py): a second one refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings
from service.storage.dir_lock import DirectoryInUseError, data_directories, lock_directory
from tests.support.redis_process import free_port

REPO = Path(__file__).resolve().parents[2]


async def test_a_second_app_on_the_same_directories_refuses_to_start(
    tmp_path, serve, create_model, small_config, make_data
):
    """Each would acknowledge learning that the other's snapshots overwrite; once the first
    has stopped, the second starts and serves what the first learned."""
    settings = Settings(snapshot_dir=str(tmp_path / "snaps"), wal_dir=str(tmp_path / "log"))
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        X, y = make_data(5)
        assert (await client.post("/v1/models/m/learn",
                                  json={"features": X, "labels": y})).status_code == 200
        for taken in (settings, Settings(snapshot_dir=str(tmp_path / "other"),
                                         wal_dir=str(tmp_path / "log"))):
            with pytest.raises(DirectoryInUseError, match=f"pid {os.getpid()}"):
                async with serve(create_app(taken)):
                    pass
    async with serve(create_app(settings)) as client:
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 5


def test_the_directories_locked_are_those_written():
    """The snapshot directory and the file log's (once, when they are the same; also when
    the log is disabled, since a log left there is read and trimmed); none with Redis, which
    holds both."""
    assert data_directories(Settings(snapshot_dir="a")) == [Path("a")]
    assert data_directories(Settings(snapshot_dir="a", wal_dir="b")) == [Path("a"), Path("b")]
    assert data_directories(Settings(snapshot_dir="a", wal_dir="./a")) == [Path("a")]
    assert data_directories(Settings(snapshot_dir="a", wal_dir="b", wal_enabled=False)) == [
        Path("a"), Path("b")]
    assert data_directories(Settings(redis_url="redis://127.0.0.1:1/0")) == []


def test_a_lock_is_released_and_can_be_taken_again(tmp_path):
    lock = lock_directory(tmp_path / "d")
    with pytest.raises(DirectoryInUseError):
        lock_directory(tmp_path / "d")
    lock.release()
    lock.release()  # twice is harmless
    lock_directory(tmp_path / "d").release()


def _server(snapshot_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GLN_")},
        "GLN_PORT": str(port),
        "GLN_SNAPSHOT_DIR": str(snapshot_dir),
        "GLN_LOG_LEVEL": "warning",
    }
    return subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_gln_service_on_a_directory_in_use_exits_3_naming_the_holder(tmp_path):
    """One line, no traceback; a data directory that cannot be one exits 2."""
    port = free_port()
    first = _server(tmp_path / "snaps", port)
    try:
        deadline = time.monotonic() + 30
        while True:  # a separate process: polling its port is the only signal we have
            assert first.poll() is None, first.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not answer /healthz in 30 s"
            time.sleep(0.05)
        second = _server(tmp_path / "snaps", free_port())
        _, err = second.communicate(timeout=60)
        assert second.returncode == 3, err.decode()
        assert f"is in use by another gln-service (pid {first.pid})" in err.decode()
        assert b"Traceback" not in err
    finally:
        first.terminate()
        first.communicate(timeout=30)
    (tmp_path / "a-file").write_text("")
    third = _server(tmp_path / "a-file", free_port())
    _, err = third.communicate(timeout=60)
    assert third.returncode == 2, err.decode()
    assert b"as a data directory" in err and b"Traceback" not in err
