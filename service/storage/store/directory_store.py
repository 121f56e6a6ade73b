"""Snapshots as files: one file per version plus a ``HEAD`` pointer per model directory."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from service.storage.common import (
    ClosingMixin,
    fsync_dir,
    is_model_name,
    model_dir_in,
    replace_all_atomically,
    replace_atomically,
)
from service.storage.store.interface import (
    SnapshotCorruptError,
    SnapshotInfo,
    as_bytes_view,
    check_metadata,
)
from service.storage.store.loading import load_current, load_newest_valid
from service.storage.wal.file_log import logs_model

log = logging.getLogger(__name__)

# Deleted model directories on their way out, and new ones on their way in: '~' is in no
# model name (is_model_name).
_DELETED_PREFIX = "deleted~"
_NEW_PREFIX = "new~"

try:  # POSIX advisory locks keep two processes from saving the same model at once.
    import fcntl
except ImportError:  # pragma: no cover - Windows: the in-process lock still applies
    fcntl = None  # type: ignore[assignment]


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data`` atomically (see ``replace_atomically``)."""
    replace_atomically(path, lambda fh: fh.write(data))


def _remove_deleted(path: Path) -> None:
    """Remove a deleted model's renamed directory; what cannot be removed is logged and left
    for the next start-up to try again (no model has its name)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("removing the files of a deleted model failed (tried again at the next "
                    "start-up): %s", exc)


def _read_version(name: str, info: SnapshotInfo, path: Path) -> bytes:
    """The bytes of a version file; SnapshotCorruptError where the file is missing."""
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise SnapshotCorruptError(f"snapshot {name!r} v{info.version}: file missing",
                                   info.version) from exc


class DirectorySnapshotStore(ClosingMixin):
    """Snapshots as files: ``{path}/{name}/v{version}.snap`` plus a ``HEAD`` JSON pointer.

    ``HEAD`` holds version, nbytes, sha256, created_at and metadata. A save writes the version
    file and then ``HEAD``, each atomically (temp + fsync + ``os.replace``), then removes
    older version files and leftover temp files. Saves of one model are serialised by a lock
    (in-process, plus an advisory ``flock`` on ``{name}/.lock`` where the OS has one), so two
    processes sharing the directory do not collide. A reader whose version file vanished
    because a save just switched ``HEAD`` starts over from the new ``HEAD``.

    The directory is created if missing, and what a delete left of a model's files removed.
    """

    _VERSION_RE = re.compile(r"v(\d+)\.(?:snap|head)")

    def __init__(self, path: str | os.PathLike[str], keep: int = 3) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.keep = keep
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        for prefix in (_DELETED_PREFIX, _NEW_PREFIX):
            for leftover in self.path.glob(f"{prefix}*"):
                _remove_deleted(leftover)

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({str(self.path)!r})"

    def _model_dir(self, name: str) -> Path:
        return model_dir_in(self.path, name)

    @contextlib.contextmanager
    def _locked(self, model_dir: Path) -> Iterator[None]:
        """Hold the in-process lock and, where available, an flock on the model's lock file."""
        with self._lock:
            if fcntl is None:  # pragma: no cover - Windows
                yield
                return
            with open(model_dir / ".lock", "a+b") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _read_head(self, model_dir: Path) -> dict[str, Any] | None:
        """The parsed HEAD file, or None when there is none."""
        try:
            raw = (model_dir / "HEAD").read_bytes()
        except FileNotFoundError:
            return None
        try:
            head = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SnapshotCorruptError(f"{model_dir.name}/HEAD is not JSON: {exc}") from exc
        if not isinstance(head, dict):
            raise SnapshotCorruptError(f"{model_dir.name}/HEAD is not a JSON object")
        return head

    def _parse_head(self, model_dir: Path, head: dict[str, Any]) -> tuple[SnapshotInfo, Path]:
        """The info ``HEAD`` holds and the version file it points to."""
        info = SnapshotInfo.from_head(head, f"{model_dir.name}/HEAD")  # no path of the host
        return info, model_dir / f"v{info.version}.snap"

    def _versions_on_disk(self, model_dir: Path) -> list[int]:
        """Versions that have a ``v{N}.snap`` file."""
        found = []
        for entry in model_dir.iterdir():
            match = self._VERSION_RE.fullmatch(entry.name)
            if match and entry.suffix == ".snap":
                found.append(int(match.group(1)))
        return found

    def _kept_heads(self, name: str, below: int) -> list[tuple[SnapshotInfo, Path]]:
        """The versions below ``below`` with a file and a head of their own, newest first."""
        model_dir = self._model_dir(name)
        kept = []
        for version in sorted(self._versions_on_disk(model_dir), reverse=True):
            head_file = model_dir / f"v{version}.head"
            if version >= below or not head_file.is_file():
                continue
            try:
                info = SnapshotInfo.from_head(json.loads(head_file.read_bytes()),
                                              f"{name}/v{version}.head")
            except (ValueError, UnicodeDecodeError):
                continue  # a damaged head of its own: that version cannot be checked
            kept.append((info, model_dir / f"v{version}.snap"))
        return kept

    def kept(self, name: str) -> list[SnapshotInfo]:
        """The infos of the versions kept of ``name`` (each with a head of its own), oldest
        first."""
        if not self._model_dir(name).is_dir():
            return []
        return [info for info, _ in reversed(self._kept_heads(name, 1 << 62))]

    def save(
        self, name: str, blob: bytes, metadata: Mapping[str, str] | None = None
    ) -> SnapshotInfo:
        """Write the next version file, switch ``HEAD`` to it, then remove older files."""
        model_dir = self._model_dir(name)
        meta = check_metadata(metadata)
        view = as_bytes_view(blob)
        sha256 = hashlib.sha256(view).hexdigest()
        if not model_dir.is_dir():
            first = self._save_first(model_dir, view, sha256, meta)
            if first is not None:
                return first
        with self._locked(model_dir):
            head = self._read_head(model_dir)
            previous = [*self._versions_on_disk(model_dir)]
            if head is not None:
                previous.append(int(head.get("version", 0)))
            version = max(previous, default=0) + 1
            info = SnapshotInfo(
                version=version,
                created_at=time.time(),
                nbytes=view.nbytes,
                sha256=sha256,
                metadata=meta,
            )
            head_json = json.dumps(info.head_fields(), sort_keys=True).encode()
            # Each version's own head beside it: what a load falls back on, should HEAD's
            # version be damaged (the newest ``keep`` versions are kept). Both are durable
            # before HEAD names their version.
            replace_all_atomically([(model_dir / f"v{version}.snap", lambda fh: fh.write(view)),
                                    (model_dir / f"v{version}.head",
                                     lambda fh: fh.write(head_json))])
            _write_atomically(model_dir / "HEAD", head_json)
            for entry in model_dir.iterdir():
                match = self._VERSION_RE.fullmatch(entry.name)
                stale = match is not None and int(match.group(1)) <= version - self.keep
                if stale or entry.name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError):
                        entry.unlink()
        return info

    def _save_first(self, model_dir: Path, view: memoryview, sha256: str,
                    metadata: dict[str, str]) -> SnapshotInfo | None:
        """Version 1 of a model that has no directory: the directory is filled under a name no
        model has (the version file, its head, ``HEAD``) and renamed into place, so that a
        crash leaves the whole model or nothing of it, never a version without its ``HEAD``
        (which a restore would take for damage). None if the directory appeared meanwhile
        (another save of the name came first; the caller saves the next version)."""
        info = SnapshotInfo(version=1, created_at=time.time(), nbytes=view.nbytes,
                            sha256=sha256, metadata=metadata)
        head_json = json.dumps(info.head_fields(), sort_keys=True).encode()
        staging = Path(tempfile.mkdtemp(dir=self.path, prefix=_NEW_PREFIX))
        try:
            replace_all_atomically([(staging / "v1.snap", lambda fh: fh.write(view)),
                                    (staging / "v1.head", lambda fh: fh.write(head_json)),
                                    (staging / "HEAD", lambda fh: fh.write(head_json))])
            try:
                staging.rename(model_dir)
            except OSError:
                if not model_dir.is_dir():
                    raise
                return None
        finally:
            if staging.exists():
                _remove_deleted(staging)
        fsync_dir(self.path)  # the new model's directory survives a power cut too
        return info

    def load(self, name: str) -> tuple[bytes, SnapshotInfo] | None:
        """Read ``HEAD``, then its version file; verify length and SHA-256. A directory whose
        ``HEAD`` is gone while what only a model that lived leaves remains (a second version,
        a log) is damage, said as such (SnapshotCorruptError), never a model that never was."""
        model_dir = self._model_dir(name)

        def current() -> tuple[bytes, SnapshotInfo] | None:
            remains = self._remains_without_head(model_dir)
            if remains:
                raise SnapshotCorruptError(f"{name}/HEAD is missing, though {remains} remain: "
                                           "the model's snapshot pointer was lost")
            return load_current(
                name,
                read_head=lambda: self._read_head(model_dir),
                parse_head=lambda head: self._parse_head(model_dir, head),
                read_blob=lambda info, path: _read_version(name, info, path),
            )

        return load_newest_valid(name, current, lambda below: [
            (info, functools.partial(_read_version, name, info, path))
            for info, path in self._kept_heads(name, below)])

    def names(self) -> list[str]:
        """Sorted names of the subdirectories that hold a ``HEAD``, or that lost theirs
        (``load`` then says so)."""
        out = []
        for entry in self.path.iterdir():
            if is_model_name(entry.name) and ((entry / "HEAD").is_file()
                                              or self._remains_without_head(entry)):
                out.append(entry.name)
        return sorted(out)

    def _remains_without_head(self, model_dir: Path) -> str:
        """What of a lived model a directory without ``HEAD`` holds ('' if it has a ``HEAD``, or
        holds nothing a model leaves once it is acknowledged: a create that crashed before its
        first ``HEAD`` leaves ``v1.snap`` alone)."""
        if not model_dir.is_dir() or (model_dir / "HEAD").exists():
            return ""
        remains = [f"v{version}.snap" for version in sorted(self._versions_on_disk(model_dir))
                   if version > 1]
        if logs_model(model_dir.parent, model_dir.name):  # a file log sharing the directory
            remains.append("its log entries")
        return ", ".join(remains)

    def delete(self, name: str) -> None:
        """Remove the model's directory (HEAD, version files, lock file).

        The directory first leaves the store in one rename, under a name no model can have:
        where that fails, the error reaches the caller and the model's snapshots are whole;
        once it succeeded, no later start-up restores the model, even where removing the
        renamed files then fails (they are removed at the next start-up)."""
        model_dir = self._model_dir(name)
        if not model_dir.exists():
            return
        with self._locked(model_dir):
            doomed = self.path / f"{_DELETED_PREFIX}{name}~{uuid.uuid4().hex}"
            model_dir.rename(doomed)
        fsync_dir(self.path)  # no power cut brings the model back
        _remove_deleted(doomed)

    def reconnect(self) -> None:
        """Nothing to reconnect: files."""

    def ping(self) -> bool:
        """True when a file can be created (and removed) in the snapshot directory."""
        try:
            with tempfile.TemporaryFile(dir=self.path, prefix=".tmp-ping-"):
                pass
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Nothing to release; present for the interface."""
