"""The file log as one log for every model: models share its segment files, appends that
arrive together share one write and one fdatasync, open files stay few whatever the model
count, trimmed segments go (a quiet model pins none), damage is pinned on the model it hit or
on the whole log, a real writer process killed mid-append loses nothing acknowledged, and the
older layout (one file per model) is carried in. The contract both logs keep is in
test_wal.py."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from service.storage.wal import (
    FileWriteAheadLog,
    LogAppend,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
    WalGapError,
    request_digest,
)
from service.storage.wal.file_log import logs_model
from tests.support.legacy_file_log import LegacyFileLog

REPO = Path(__file__).resolve().parents[2]


def row(tag: int, n: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A chunk whose values and labels say which append it came from."""
    return np.full((n, 4), tag, np.float32), np.full(n, tag, np.int64)


def tags(entries: Iterable[LogEntry]) -> list[int]:
    return [int(e.labels[0]) for e in entries]


def segments(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "wal~").iterdir())


def first_segment(root: Path) -> Path:
    return root / "wal~" / "00000001.wal"


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh Python process (the repository importable); its output."""
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


# -- one log, group commit ------------------------------------------------------------------


def test_every_model_appends_to_one_file(tmp_path: Path) -> None:
    wal = FileWriteAheadLog(tmp_path)
    for i in range(300):
        wal.append(f"m{i}", *row(i))
    assert os.listdir(tmp_path) == ["wal~"]  # no file or directory per model
    assert segments(tmp_path) == ["00000001.wal"]
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert all(tags(reopened.read_after(f"m{i}", None)) == [i] for i in range(300))
    reopened.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd (Linux)")
def test_open_files_stay_few_whatever_the_model_count(tmp_path: Path) -> None:
    """2,000 models appended to, read and trimmed: the log holds one file open (the newest
    segment), where a file per model held 2,000."""

    def open_files() -> int:  # of the log's directory: other tests' files come and go
        held = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # closed since it was listed
                held += os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
        return held

    before = open_files()
    assert before == 0
    wal = FileWriteAheadLog(tmp_path, fsync=False, segment_bytes=64 * 1024)
    for i in range(2000):
        wal.append(f"m{i}", *row(i))
    assert open_files() <= before + 1
    assert all(tags(wal.read_after(f"m{i}", None)) == [i] for i in range(2000))
    reader = wal.read_after("m5", None)
    next(reader)
    assert open_files() <= before + 2  # a read under way holds its segment open, until ...
    reader.close()  # ... it ends or is closed
    appended = segments(tmp_path)
    assert len(appended) > 3
    for i in range(2000):
        wal.trim_through(f"m{i}", "1")
    assert not set(appended[:-1]) & set(segments(tmp_path))  # the trims freed them
    assert open_files() <= before + 1
    wal.close()
    assert open_files() == before


def test_append_many_is_one_write_and_one_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    wal = FileWriteAheadLog(tmp_path)
    wal.append("m0", *row(0))
    writes, syncs = [], []
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: writes.append(at) or real_pwrite(
        fd, data, at))
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd) or real_fdatasync(fd))
    counted = wal.syncs
    results = wal.append_many([LogAppend(f"m{i}", *row(i)) for i in range(64)])
    assert results == ["2"] + ["1"] * 63
    assert (len(writes), len(syncs), wal.syncs - counted) == (1, 1, 1)
    monkeypatch.undo()
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert tags(reopened.read_after("m0", None)) == [0, 0]
    assert all(tags(reopened.read_after(f"m{i}", None)) == [i] for i in range(1, 64))
    reopened.close()


def test_appends_in_a_deferred_sync_block_are_one_write_and_one_fdatasync_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    wal = FileWriteAheadLog(tmp_path)
    writes, syncs = [], []
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: writes.append(at) or real_pwrite(
        fd, data, at))
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd) or real_fdatasync(fd))
    with wal.deferred_sync():
        ids = [wal.append(f"m{i}", *row(i)) for i in range(8)]
        assert (writes, syncs) == ([], [])  # nothing written while the block lasts
    assert ids == ["1"] * 8
    assert (len(writes), len(syncs)) == (1, 1)
    monkeypatch.undo()
    assert all(tags(wal.read_after(f"m{i}", None)) == [i] for i in range(8))
    wal.close()


def test_a_deferred_sync_that_fails_raises_and_the_log_reads_the_disk_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    wal = FileWriteAheadLog(tmp_path)
    wal.append("m0", *row(0))

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(OSError, match="Input/output"), wal.deferred_sync():
        wal.append("m0", *row(1))
        wal.append("m1", *row(2))
    monkeypatch.undo()
    # What reached the file is read back: the ids go on from there, nothing is doubled.
    last = wal.last_id("m0")
    assert last in ("1", "2") and tags(wal.read_after("m0", None)) == [0, 1][:int(last)]
    assert wal.append("m0", *row(3)) == str(int(last) + 1)
    wal.close()


def test_appends_of_eight_threads_share_fdatasyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each thread appends on its own (as a model's writer does); while one fdatasyncs, the
    others' appends queue and go down together with the next. A disk whose fdatasync takes
    2 ms makes the sharing plain."""
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        time.sleep(0.002)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    wal = FileWriteAheadLog(tmp_path)
    threads, per_thread = 8, 40
    logged: dict[tuple[str, str], int] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(per_thread):
                name, tag = f"m{(t * 7 + i) % 30}", t * 1000 + i
                logged[name, wal.append(name, *row(tag))] = tag
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not errors, errors[0]
    appends = threads * per_thread
    assert len(logged) == appends
    assert wal.syncs <= appends / 3, f"{wal.syncs} fdatasyncs for {appends} appends"
    found = {(f"m{m}", e.id): int(e.labels[0]) for m in range(30)
             for e in wal.read_after(f"m{m}", None)}
    assert found == logged  # each append logged once, under the id it was answered
    wal.close()


# -- space --------------------------------------------------------------------------------


def test_trimmed_segments_go_and_a_quiet_model_pins_none(tmp_path: Path) -> None:
    """Five models learn and are snapshotted (trimmed) all along; a sixth appended once, at
    the start, and never again. Its record is carried forward, so the oldest segments go."""
    wal = FileWriteAheadLog(tmp_path, fsync=False, segment_bytes=4096)
    X, y = row(7)
    wal.append("quiet", X, y, ["quiet-key"], None, [request_digest(X, y)])
    for step in range(60):
        for m in range(5):
            wal.trim_through(f"busy{m}", wal.append(f"busy{m}", *row(step, n=4)))
    wal.append("busy0", *row(60))  # not trimmed: still needed
    names = segments(tmp_path)
    assert "00000001.wal" not in names and len(names) <= 3, names
    assert sum((tmp_path / "wal~" / n).stat().st_size for n in names) <= 4 * 4096
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert tags(reopened.read_after("quiet", None)) == [7]
    assert reopened.logged_requests("quiet", ["quiet-key"]) == [
        LoggedRequest("1", request_digest(X, y))]
    assert tags(reopened.read_after("busy0", "60")) == [60]
    assert tags(reopened.read_after("busy1", None)) == []
    with pytest.raises(WalGapError):
        reopened.read_after("busy1", "59")
    assert reopened.last_id("busy1") == "60" and reopened.append("busy1", *row(1)) == "61"
    assert reopened.append("quiet", *row(8)) == "2"
    reopened.close()


def test_a_read_under_way_keeps_the_segments_it_reads(tmp_path: Path) -> None:
    wal = FileWriteAheadLog(tmp_path, fsync=False, segment_bytes=1024)
    ids = [wal.append("m", *row(i, n=8)) for i in range(10)]
    assert len(segments(tmp_path)) > 2
    reader = wal.read_after("m", None)
    assert tags([next(reader)]) == [0]
    wal.trim_through("m", ids[-1])  # every segment but the newest is free now ...
    assert tags(reader) == list(range(1, 10))  # ... but kept until the read ends
    wal.trim_through("m", wal.append("m", *row(10)))
    assert len(segments(tmp_path)) == 1
    wal.close()


# -- damage -------------------------------------------------------------------------------


def _written(wal: FileWriteAheadLog, root: Path, appends: list[tuple[str, int, int]]) -> list[int]:
    """Append (model, tag, rows) each; where each write ends in the first segment."""
    ends = []
    for name, tag, n in appends:
        wal.append(name, *row(tag, n))
        ends.append(first_segment(root).stat().st_size)
    return ends


def test_a_damaged_record_refuses_its_model_alone(tmp_path: Path) -> None:
    """A record's payload damaged under an intact head: the head says whose it was, so that
    model is refused (unrestored, loudly) and the others go on; deleting it starts it afresh."""
    wal = FileWriteAheadLog(tmp_path)
    ends = _written(wal, tmp_path, [("a", 1, 50), ("b", 2, 50), ("a", 3, 50), ("c", 4, 1)])
    wal.close()
    data = bytearray(first_segment(tmp_path).read_bytes())
    data[ends[1] - 3] ^= 0x01  # inside b's labels
    first_segment(tmp_path).write_bytes(bytes(data))

    wal = FileWriteAheadLog(tmp_path)
    with pytest.raises(WalCorruptError, match="a record of 'b' at byte .* is damaged"):
        wal.read_after("b", None)
    with pytest.raises(WalCorruptError):
        wal.append("b", *row(5))
    with pytest.raises(WalCorruptError):
        wal.last_id("b")
    assert tags(wal.read_after("a", None)) == [1, 3] and tags(wal.read_after("c", None)) == [4]
    assert wal.append("a", *row(5)) == "3"
    assert first_segment(tmp_path).read_bytes().startswith(bytes(data))  # nothing cut off
    wal.delete("b")
    assert wal.append("b", *row(6)) == "1"
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert tags(reopened.read_after("b", None)) == [6]
    assert tags(reopened.read_after("a", None)) == [1, 3, 5]
    reopened.close()


def test_a_damaged_head_refuses_the_whole_log(tmp_path: Path) -> None:
    """A write's head damaged, with writes after it: whose records it held, and where the next
    one starts, cannot be told, so any model may have lost an acknowledged entry."""
    wal = FileWriteAheadLog(tmp_path)
    ends = _written(wal, tmp_path, [("a", 1, 5), ("b", 2, 5), ("a", 3, 5)])
    wal.close()
    data = bytearray(first_segment(tmp_path).read_bytes())
    data[ends[0] + 20] ^= 0x01  # inside the second write's head
    first_segment(tmp_path).write_bytes(bytes(data))

    wal = FileWriteAheadLog(tmp_path)
    for call in (lambda: wal.read_after("a", None), lambda: wal.last_id("c"),
                 lambda: wal.append("c", *row(4)), lambda: wal.trim_through("a", "1")):
        with pytest.raises(WalCorruptError, match=f"byte {ends[0]} is unreadable.*every model"):
            call()
    assert first_segment(tmp_path).read_bytes() == bytes(data)
    wal.close()


# -- crashes of a real writer -------------------------------------------------------------

_TORN_WRITER = r"""
import os, signal, sys
import numpy as np
from service.storage.wal import FileWriteAheadLog, LogAppend, file_log

wal = FileWriteAheadLog(sys.argv[1])
def appends(i):
    return [LogAppend(f"m{j}", np.full((3, 4), i, np.float32), np.full(3, i), [f"k{i}-{j}"])
            for j in range(5)]
for i in range(int(sys.argv[2])):
    print(" ".join(wal.append_many(appends(i))), flush=True)  # acknowledged

def cut_short(fd, data, offset):  # the process dies half-way through its next write
    os.pwrite(fd, data[:len(data) // 2], offset)
    os.kill(os.getpid(), signal.SIGKILL)
file_log._pwrite_all = cut_short
wal.append_many(appends(99))
"""


def test_a_writer_killed_mid_append_loses_nothing_acknowledged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A real process killed (SIGKILL) half-way through a write: the write's torn half is
    ignored and then overwritten, every acknowledged entry and key is there."""
    done = run_child(_TORN_WRITER, str(tmp_path), "6")
    assert done.returncode == -signal.SIGKILL, done.stderr
    acknowledged = [line.split() for line in done.stdout.splitlines()]
    assert acknowledged == [[str(i + 1)] * 5 for i in range(6)]
    with caplog.at_level(logging.WARNING, logger="service.storage.wal.file_log"):
        wal = FileWriteAheadLog(tmp_path)
        assert all(tags(wal.read_after(f"m{j}", None)) == list(range(6)) for j in range(5))
    assert "are not a whole write and are cut off" in caplog.text
    assert wal.seen_keys("m4", ["k5-4", "k99-4"]) == ["6", None]
    assert wal.append("m0", *row(7)) == "7"
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert tags(reopened.read_after("m0", "5")) == [5, 7]
    reopened.close()


_LOADED_WRITER = r"""
import sys, threading
import numpy as np
from service.storage.wal import FileWriteAheadLog

wal = FileWriteAheadLog(sys.argv[1])
lock = threading.Lock()
def work(t):
    for i in range(100_000):
        name = f"m{(t * 31 + i * 7) % 40}"
        entry_id = wal.append(name, np.full((50, 4), i, np.float32), np.full(50, t * 1_000_000 + i))
        with lock:
            print(name, entry_id, t * 1_000_000 + i, flush=True)
for t in range(4):
    threading.Thread(target=work, args=(t,)).start()
"""


def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Four threads of a real process append to 40 models until it is SIGKILLed (a write
    may be cut short); every append it acknowledged is there, with its data and id."""
    child = subprocess.Popen([sys.executable, "-c", _LOADED_WRITER, str(tmp_path)], cwd=REPO,
                             text=True, stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout is not None
    lines = [child.stdout.readline() for _ in range(400)]
    child.kill()
    lines += child.stdout.read().split("\n")
    child.wait(timeout=30)
    acknowledged = {}
    for line in lines:  # whole lines only: the kill may cut the last one
        fields = line.split()
        if len(fields) == 3 and fields[2].isdigit():
            acknowledged[fields[0], fields[1]] = int(fields[2])
    assert len(acknowledged) >= 400
    wal = FileWriteAheadLog(tmp_path)
    found = {(f"m{m}", e.id): int(e.labels[0]) for m in range(40)
             for e in wal.read_after(f"m{m}", None)}
    lost = {key: tag for key, tag in acknowledged.items() if found.get(key) != tag}
    assert not lost
    assert len(found) - len(acknowledged) <= 4  # at most one append a thread under way
    wal.close()


# -- the older layout ---------------------------------------------------------------------


def _legacy_directory(root: Path) -> str:
    """Files of the older layout, as its code wrote them: model ``m`` trimmed once, with keys,
    a digest, a wait entry and a learn entry of its rows; model ``n`` beside a snapshot."""
    old = LegacyFileLog(root)
    X, y = row(1, n=3)
    digest = request_digest(X[:1], y[:1])
    old.append("m", X, y, ["k1", None], [1, 2], [digest, None])
    old.append_waiting("m", ["a"], X[:1], np.full((1, 2), 0.5), 5.0, ["z"])
    old.append("m", *row(2), label_ids=["a"], start=3)
    old.trim_through("m", "1")
    old.append("m", *row(3), ["k2"])
    old.append("n", *row(4))
    (root / "n" / "HEAD").write_bytes(b"{}")
    return digest


def _check_carried(wal: FileWriteAheadLog, digest: str) -> None:
    waiting, learned, keyed = wal.read_after("m", "1")
    assert [waiting.id, learned.id, keyed.id] == ["2", "3", "4"]
    assert waiting.waiting and waiting.label_ids == ("a",) and waiting.expired_ids == ("z",)
    assert waiting.predictions is not None and waiting.predictions.tolist() == [[0.5, 0.5]]
    assert learned.label_ids == ("a",) and learned.start == 3 and tags([learned]) == [2]
    assert tags([keyed]) == [3] and keyed.idempotency_keys == ("k2",)
    assert [e.id for e in wal.read_after("m", None)] == ["2", "3", "4"]
    with pytest.raises(WalGapError):
        wal.read_after("m", "0")
    assert wal.logged_requests("m", ["k1", "k2"]) == [LoggedRequest("1", digest),
                                                      LoggedRequest("4", None)]
    assert wal.last_id("m") == "4" and tags(wal.read_after("n", None)) == [4]


def test_the_older_layout_is_carried_in_and_its_files_removed(tmp_path: Path) -> None:
    digest = _legacy_directory(tmp_path)
    wal = FileWriteAheadLog(tmp_path)
    _check_carried(wal, digest)
    assert sorted(os.listdir(tmp_path)) == ["n", "wal~"]  # m's directory held its log alone
    assert os.listdir(tmp_path / "n") == ["HEAD"]
    assert wal.append("m", *row(5)) == "5"
    wal.close()
    reopened = FileWriteAheadLog(tmp_path)
    assert [e.id for e in reopened.read_after("m", "1")] == ["2", "3", "4", "5"]
    assert reopened.logged_requests("m", ["k1"]) == [LoggedRequest("1", digest)]
    reopened.close()


_KILLED_MIGRATION = r"""
import os, signal, sys
from service.storage.wal import FileWriteAheadLog

real_unlink = os.unlink
def unlink(path, *args, **kwargs):  # killed once carried, before an old file is removed
    if str(path).endswith("wal.log"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_unlink(path, *args, **kwargs)
os.unlink = unlink
FileWriteAheadLog(sys.argv[1]).last_id("m")
"""


def test_a_migration_killed_before_the_old_files_go_is_done_again_harmlessly(
    tmp_path: Path,
) -> None:
    digest = _legacy_directory(tmp_path)
    done = run_child(_KILLED_MIGRATION, str(tmp_path))
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (tmp_path / "m" / "wal.log").exists() and (tmp_path / "wal~").exists()
    wal = FileWriteAheadLog(tmp_path)  # carries it all again: nothing lost, nothing twice
    _check_carried(wal, digest)
    assert not (tmp_path / "m").exists()
    wal.close()


def test_a_damaged_file_of_the_older_layout_refuses_its_model_alone(tmp_path: Path) -> None:
    old = LegacyFileLog(tmp_path)
    for i in range(3):
        old.append("bad", *row(i, n=50))
    old.append("good", *row(9))
    data = bytearray(old.file("bad").read_bytes())
    data[len(data) // 2] ^= 0x01
    old.file("bad").write_bytes(bytes(data))
    wal = FileWriteAheadLog(tmp_path)
    assert tags(wal.read_after("good", None)) == [9]
    with pytest.raises(WalCorruptError, match="damaged"):
        wal.read_after("bad", None)
    assert old.file("bad").read_bytes() == bytes(data)  # kept for whoever repairs it
    wal.delete("bad")
    assert not old.file("bad").exists() and wal.append("bad", *row(1)) == "1"
    wal.close()


def test_what_the_log_holds_of_a_model_is_evidence_that_it_lived(tmp_path: Path) -> None:
    """The snapshot store sharing the directory asks the log (without opening it) whether a
    model whose HEAD is gone had learned: records until its delete, or an older-layout file."""
    wal = FileWriteAheadLog(tmp_path)
    wal.append("a", *row(1))
    wal.append("ab", *row(2))
    wal.delete("ab")
    assert logs_model(tmp_path, "a") and not logs_model(tmp_path, "ab")
    assert not logs_model(tmp_path, "b") and not logs_model(tmp_path / "elsewhere", "a")
    LegacyFileLog(tmp_path).append("old", *row(3))
    assert logs_model(tmp_path, "old")
    wal.close()
