"""``python -m service`` really serves: a subprocess on a free port, SIGTERM, a snapshot on disk.

Also the settings: every GLN_* variable of the issue is read with its documented default.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from gln import GLN
from service.settings import Settings
from service.storage.store import open_store
from tests.support.redis_process import free_port

REPO = Path(__file__).resolve().parents[2]


def test_python_m_service_serves_and_snapshots_on_sigterm(tmp_path: Path, make_data):
    port = free_port()
    snapshots = tmp_path / "snaps"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GLN_")},
        "GLN_PORT": str(port),
        "GLN_SNAPSHOT_DIR": str(snapshots),
        "GLN_SNAPSHOT_INTERVAL_S": "3600",
        "GLN_MAX_BODY_BYTES": "4096",
        "GLN_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "service"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            deadline = time.monotonic() + 30
            while True:  # a separate process: polling its port is the only signal we have
                assert proc.poll() is None, proc.stdout.read().decode()
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "server did not answer /healthz in 30 s"
                time.sleep(0.05)
            config = {"num_features": 6, "num_classes": 3, "layer_sizes": [8, 1]}
            r = client.post("/v1/models", json={"name": "m", "config": config})
            assert r.status_code == 201, r.text
            X, y = make_data(20)
            r = client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200 and r.json()["examples"] == 20
            assert client.get("/readyz").status_code == 200

            # A real chunked upload over GLN_MAX_BODY_BYTES, no Content-Length.
            def chunks():
                for _ in range(100):
                    yield b" " * 100

            r = client.post(
                "/v1/models/m/predict",
                content=chunks(),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 413

        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    store = open_store(None, str(snapshots))
    blob, info = store.load("m")
    assert info.version == 1  # written by the SIGTERM shutdown (a create logs a birth)
    assert GLN.from_bytes(blob).examples_seen == 20


def test_settings_read_gln_environment(monkeypatch: pytest.MonkeyPatch):
    defaults = Settings()
    assert (defaults.host, defaults.port, defaults.device) == ("127.0.0.1", 8000, "cpu")
    assert defaults.redis_url is None and defaults.snapshot_dir == "./snapshots"
    assert defaults.snapshot_interval_s == 60 and defaults.api_token is None
    assert defaults.max_body_bytes == 64 * 1024 * 1024

    env = {
        "GLN_HOST": "0.0.0.0",
        "GLN_PORT": "9001",
        "GLN_DEVICE": "auto",
        "GLN_REDIS_URL": "redis://cache:6379/1",
        "GLN_SNAPSHOT_DIR": "/data/snaps",
        "GLN_SNAPSHOT_INTERVAL_S": "5",
        "GLN_API_TOKEN": "hunter2-xyz",
        "GLN_MAX_BODY_BYTES": "1024",
        "GLN_MAX_ROWS_PER_REQUEST": "7",
        "GLN_LOG_LEVEL": "debug",
    }
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    s = Settings()
    assert (s.host, s.port, s.device, s.redis_url) == (
        "0.0.0.0",
        9001,
        "auto",
        "redis://cache:6379/1",
    )
    assert (s.snapshot_dir, s.snapshot_interval_s, s.max_body_bytes) == ("/data/snaps", 5, 1024)
    assert s.api_token is not None and s.api_token.get_secret_value() == "hunter2-xyz"
    assert "hunter2" not in repr(s)  # the token never lands in logs
    assert (s.max_rows_per_request, s.log_level) == (7, "debug")

    monkeypatch.setenv("GLN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device"):
        Settings()


def test_empty_variables_mean_unset(monkeypatch: pytest.MonkeyPatch):
    """docker-compose passes ``GLN_API_TOKEN=`` when the shell has none: that is no token (no
    auth), not an empty token, and an empty Redis URL is the directory store."""
    for key in ("GLN_API_TOKEN", "GLN_REDIS_URL", "GLN_PORT"):
        monkeypatch.setenv(key, "")
    s = Settings()
    assert (s.api_token, s.redis_url, s.port) == (None, None, 8000)


def test_a_durability_redis_cannot_give_stops_the_server_at_start_up(
    tmp_path: Path, redis_url: str, redis_key_prefix: str
):
    """GLN_WAL_DURABILITY=always against a Redis without AOF: exit, naming what is missing."""
    client = redis.Redis.from_url(redis_url)
    try:
        if int(client.info("persistence").get("aof_enabled", 0)):
            pytest.skip("the test Redis runs with AOF on")
    finally:
        client.close()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GLN_")},
        "GLN_PORT": str(free_port()),
        "GLN_REDIS_URL": redis_url,
        "GLN_REDIS_KEY_PREFIX": redis_key_prefix,
        "GLN_WAL_DURABILITY": "always",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=REPO, env=env, capture_output=True, timeout=60,
    )
    assert done.returncode == 3
    refusals = [line for line in done.stderr.splitlines() if line.startswith(b"gln-service:")]
    assert len(refusals) == 1
    assert refusals[0].startswith(b"gln-service: durability='always' is not available: AOF is off")
    assert b"Traceback" not in done.stderr


def test_a_wrong_setting_exits_2_naming_each_variable(monkeypatch, capsys, tmp_path):
    """A misconfigured server says which ``GLN_*`` variables are wrong, one line each, and
    exits 2 before it serves anything (not with a validation traceback)."""
    from service.__main__ import main

    monkeypatch.setenv("GLN_PORT", "abc")
    monkeypatch.setenv("GLN_REDIS_URL", "redis+sentinel://h1:port/gln")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gln-service: invalid configuration:")
    assert "GLN_PORT: Input should be a valid integer" in err and "(got 'abc')" in err
    assert "GLN_REDIS_URL: each Sentinel is host[:port]" in err
    assert "Traceback" not in err

    monkeypatch.delenv("GLN_PORT")
    monkeypatch.delenv("GLN_REDIS_URL")
    monkeypatch.setenv("GLN_WAL_REPLICAS", "1")
    assert main([]) == 2
    assert "GLN_WAL_REPLICAS needs the Redis log: set GLN_REDIS_URL" in capsys.readouterr().err

    monkeypatch.delenv("GLN_WAL_REPLICAS")
    monkeypatch.setenv("GLN_SNAPSHOT_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GLN_WAL_DIR", str(tmp_path / "data" / "wal"))
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "  GLN_WAL_DIR (" in err and "must be the same directory or apart" in err
    assert "Value error" not in err


def test_a_misspelt_variable_is_named_with_the_setting_it_looks_like():
    from service.settings import unknown_variables

    warnings = unknown_variables({"GLN_REDIS_URI": "redis://h", "GLN_SNAPSHOT_INTERVAL": "5",
                                  "GLN_PORT": "1", "GLN_DATA_DIR": "/data", "HOME": "/root",
                                  "GLN_ZZZ": "1", "GLN_Port": "2", "gln_redis_url": "x"})
    assert warnings == [
        "GLN_REDIS_URI is not a setting and is ignored (did you mean GLN_REDIS_URL?)",
        "GLN_SNAPSHOT_INTERVAL is not a setting and is ignored "
        "(did you mean GLN_SNAPSHOT_INTERVAL_S?)",
        "GLN_ZZZ is not a setting and is ignored",
    ]


def test_the_start_up_summary_says_where_things_go_and_hides_passwords(tmp_path):
    local = Settings(snapshot_dir=str(tmp_path), wal_fsync=False).summary()
    assert f"snapshots to directory {tmp_path}" in local
    assert f"write-ahead log: file in {tmp_path}, fsync off" in local
    remote = Settings(redis_url="redis://user:hunter2@cache:6379/3", wal_enabled=False,
                      api_token="t0ken").summary()
    assert "redis://user:***@cache:6379/3" in remote and "hunter2" not in remote
    in_query = Settings(redis_url="redis+sentinel://s1,s2/main/1?sentinel_password=hunter2"
                        ).summary()
    assert "main/1?sentinel_password=***" in in_query and "hunter2" not in in_query
    assert "password=***" in Settings(redis_url="redis://h/0?password=hunter2").summary()
    assert "write-ahead log: off" in remote and "bearer token required" in remote
    assert "t0ken" not in remote


def test_a_wrong_redis_url_is_not_repeated_in_the_error(monkeypatch, capsys):
    from service.__main__ import main

    monkeypatch.setenv("GLN_REDIS_URL", "redis+sentinel://user:hunter2@h1:port/gln")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "GLN_REDIS_URL: each Sentinel is host[:port]" in err and "hunter2" not in err


def test_the_open_files_limit_is_raised_to_the_hard_one():
    """Every connection is a file, and uvicorn keeps idle ones open: the usual soft limit of
    1,024 let that many idle sockets shut every client out."""
    script = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from service.__main__ import _raise_open_files_limit\n"
        "_raise_open_files_limit()\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    soft, hard = map(int, done.stdout.split())
    assert soft == hard


@pytest.mark.parametrize(("snapshots", "log", "accepted"), [
    ("data", "data", True), ("data", "data/./", True), ("data/snapshots", "data/wal", True),
    ("data", "data/wal", False), ("data/snapshots", "data", False),
])
def test_the_log_directory_is_the_snapshot_directory_or_apart_from_it(
    tmp_path, snapshots: str, log: str, accepted: bool
):
    """Both hold a directory per model: nested, a model could be named like the inner one."""
    from pydantic import ValidationError

    from service.settings import Settings

    def settings() -> Settings:
        return Settings(snapshot_dir=str(tmp_path / snapshots), wal_dir=str(tmp_path / log))

    if accepted:
        settings()
    else:
        with pytest.raises(ValidationError, match="not one inside the other"):
            settings()


def test_a_device_the_machine_lacks_stops_the_server_at_start_up(monkeypatch, capsys):
    """GLN_DEVICE=cuda without CuPy and a GPU: no model could be built, so the server does not
    start (it used to serve, and answer every create with a 422 its clients could not fix)."""
    from gln.backend import resolve_device
    from service.__main__ import main

    try:
        resolve_device("cuda")
    except ValueError:
        pass
    else:
        pytest.skip("this machine has a CUDA GPU")
    monkeypatch.setenv("GLN_DEVICE", "cuda")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gln-service: GLN_DEVICE=cuda: device='cuda' needs CuPy and a CUDA GPU")


def test_a_log_level_is_taken_in_any_case():
    from pydantic import ValidationError

    from service.settings import Settings

    assert [Settings(log_level=level).log_level for level in ("INFO", "Debug", "warning")] == [
        "info", "debug", "warning"]
    with pytest.raises(ValidationError, match="'critical', 'error', 'warning', 'info' or"):
        Settings(log_level="loud")


def test_a_taken_port_stops_the_server_at_once(monkeypatch, capsys, tmp_path):
    """The address is bound before the start-up restores anything: a second server on a port
    in use exits 3 in one line, without restoring the stored models first."""
    import socket

    from service.__main__ import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("GLN_PORT", str(port))
        monkeypatch.setenv("GLN_SNAPSHOT_DIR", str(tmp_path / "snapshots"))
        assert main([]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"gln-service: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in err and "Traceback" not in err
