"""A power cut, simulated: what survives is what was fsynced, and nothing acknowledged is lost.

:class:`DurableDisk` wraps ``os.fsync``/``os.fdatasync`` for the test: a file's fsync records
its bytes as of then, a directory's fsync records which names it holds (both by inode, as a
file system keeps them: a directory filled under one name and renamed keeps its entries). At the cut
the data directory is rebuilt from those records alone, as a disk that lost power would hold
it: a name the directory was never fsynced with is gone, a file's bytes past its last fsync are
gone. A server restarted on that directory (directory store, file log) must hold every example
it acknowledged; with the log's fsync off (GLN_WAL_FSYNC=false) the same cut loses some, which
shows the cut drops what it should.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from gln import GLN
from service.api.app import create_app
from service.settings import Settings
from tests.service.staged_crash import model_bytes, skip_shutdown_snapshots


class DurableDisk:
    """What fsync made durable under ``root``: file bytes and directory names, by inode."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root.resolve()
        self.contents: dict[int, bytes] = {}
        self.listings: dict[int, dict[str, int]] = {}
        self._fsync, self._fdatasync = os.fsync, os.fdatasync
        monkeypatch.setattr(os, "fsync", self._recorded(self._fsync))
        monkeypatch.setattr(os, "fdatasync", self._recorded(self._fdatasync))

    def _recorded(self, sync):  # noqa: ANN001, ANN202 - os.fsync's own shape
        def recorded(fd: int) -> None:
            sync(fd)
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                path = Path(os.readlink(f"/proc/self/fd/{fd}"))
                self.listings[info.st_ino] = {e.name: e.inode() for e in os.scandir(path)}
            elif stat.S_ISREG(info.st_mode):  # read anew: the fd may be open for appends only
                with open(f"/proc/self/fd/{fd}", "rb") as synced:
                    self.contents[info.st_ino] = synced.read()
        return recorded

    def cut(self, into: Path) -> None:
        """``root`` as the disk holds it after a power cut, rebuilt under ``into``."""
        self._rebuild(self.root, into)

    def _rebuild(self, directory: Path, into: Path) -> None:
        into.mkdir(parents=True)
        for name, inode in self.listings.get(directory.stat().st_ino, {}).items():
            path = directory / name
            if path.is_dir() and path.stat().st_ino == inode:
                self._rebuild(path, into / name)
            elif not path.is_dir():
                (into / name).write_bytes(self.contents.get(inode, b""))


pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(),
                                reason="reads fsynced files through /proc/self/fd (Linux)")


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DurableDisk:
    root = tmp_path / "data"
    root.mkdir()
    return DurableDisk(root, monkeypatch)


@pytest.mark.parametrize("fsync", [True, False])
async def test_a_power_cut_loses_nothing_acknowledged(
    disk: DurableDisk, tmp_path: Path, serve, small_config, create_model, make_data, fsync
):
    settings = Settings(snapshot_dir=str(disk.root), snapshot_interval_s=3600, wal_fsync=fsync)
    app = create_app(settings)
    acknowledged = 0
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        for seed in range(6):
            X, y = make_data(5, seed=seed)
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200
            acknowledged += 5
            if seed == 2:  # a snapshot (and a trim of the log) between the learns
                assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        # A model with no snapshot at all: its birth in the log, then its learning.
        await create_model(client, "born", small_config)
        X, y = make_data(5, seed=9)
        assert (await client.post("/v1/models/born/learn",
                                  json={"features": X, "labels": y})).status_code == 200
        live = await model_bytes(app, "m")
        born_live = await model_bytes(app, "born")
        disk.cut(tmp_path / "after-cut")  # the power goes now
        skip_shutdown_snapshots(app)
    shutil.rmtree(disk.root)
    (tmp_path / "after-cut").rename(disk.root)
    restarted = create_app(settings.model_copy(update={"wal_fsync": True}))
    async with serve(restarted) as client:
        restored = (await client.get("/v1/models/m")).json()["examples_seen"]
        restored_bytes = await model_bytes(restarted, "m")
        born = await client.get("/v1/models/born")
        born_bytes = await model_bytes(restarted, "born") if born.status_code == 200 else b""
    if fsync:
        assert restored == acknowledged and restored_bytes == live
        assert born.json()["snapshot"] is None and born_bytes == born_live
        assert GLN.from_bytes(restored_bytes).examples_seen == acknowledged
    else:  # without fsync the log's tail was never durable: the cut loses it
        assert restored < acknowledged
