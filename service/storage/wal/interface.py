"""What the service relies on of a write-ahead log: the ``WriteAheadLog`` interface, the entries
it gives back (``LogEntry``), one append of many logged together (``LogAppend``), what it
remembers of an idempotency key (``LoggedRequest``), and its errors. ``service.storage.wal``
describes the log as a whole."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np

DEFAULT_IDEMPOTENCY_TTL_S = 24 * 3600.0
"""How long a logged idempotency key is remembered: long enough for any sane client retry."""

Durability = Literal["everysec", "always", "waitaof"]
"""When :class:`RedisWriteAheadLog` counts an append as done (see its docstring)."""


class WalCorruptError(ValueError):
    """A log record is damaged (bad checksum, unreadable header, ids out of order).

    A torn *last* record of a file log (a write cut short by a crash) is not corruption: it
    was never acknowledged, so it is ignored and overwritten by the next append.
    """


class WalGapError(WalCorruptError):
    """``read_after(name, id)`` was asked for entries the log has already trimmed away.

    Replaying from there would silently skip examples: typically a snapshot older than the
    log's trim point (restored from a backup, say).
    """


class WalDurabilityError(RuntimeError):
    """The Redis server cannot give the durability asked for, or did not confirm it in time."""


class WalDivergedError(RuntimeError):
    """The log is not what its writer last saw: it does not end where the writer left it
    (entries the writer appended or read are gone: a Redis failover promoted a replica that
    had not received them), or it already holds an idempotency key that the writer looked up
    and did not find there. Nothing was appended. The writer may hold state the log cannot
    replay, and must rebuild it from its snapshot and the log as they are now
    (``ServedModel`` does)."""

    def __init__(
        self, name: str, expected: str | None, found: str | None, known_key: str | None = None,
    ) -> None:
        if known_key is None:
            what = (f"the log of {name!r} ends at {found or 'nothing'}, not at "
                    f"{expected or 'nothing'} where this writer left it")
        else:
            what = (f"the log of {name!r} already holds idempotency key {known_key!r}, which "
                    "this writer did not find there")
        super().__init__(f"{what}: it changed behind the writer (a failover?)")
        self.expected, self.found, self.known_key = expected, found, known_key


ANY_END = "*"
"""``follows`` of an append that does not check where the log ends (ids are never ``*``)."""


@dataclass(frozen=True)
class LogEntry:
    """One logged chunk: its id, its examples, and the idempotency keys it was logged with.

    ``features`` and ``labels`` have the dtype and shape they were appended with; they are
    read-only views of the bytes read back (copy them to modify).
    """

    id: str
    features: np.ndarray
    labels: np.ndarray
    idempotency_keys: tuple[str | None, ...] = ()
    created_at: float = 0.0
    request_rows: tuple[int, ...] = ()  # rows of each request in the chunk, if logged
    request_digests: tuple[str | None, ...] = ()  # each request's request_digest, if logged
    # Delayed labels (service/engine/waiting_rows.py). A learn entry: the ids of the waiting rows it
    # learned, which stop waiting. A wait entry: the id of each of its rows.
    label_ids: tuple[str, ...] = ()
    predictions: np.ndarray | None = None  # wait entry: (n, num_classes), as predicted
    expires_at: float = 0.0  # wait entry: when its rows' wait ends (time.time())
    # Wait entry: ids that expired (dropped, their label never came) once its rows were put.
    expired_ids: tuple[str, ...] = ()
    # Learn entry: how many examples the model had learned before it (None: logged before
    # entries said so). A replay that finds another count has lost entries: never smaller.
    start: int | None = None
    # Birth entry: the configuration the model was created with (GLN.config), no rows.
    config: dict[str, Any] | None = None

    @property
    def birth(self) -> bool:
        """True for a birth entry: the model's configuration, logged when it was created."""
        return self.config is not None

    @property
    def waiting(self) -> bool:
        """True for a wait entry: rows put to wait for labels, nothing learned (no labels)."""
        return self.predictions is not None


@dataclass(frozen=True, eq=False)
class LogAppend:
    """One append of :meth:`WriteAheadLog.append_many`: the arguments of
    :meth:`WriteAheadLog.append` (a learn entry: ``labels`` given), with ``predictions`` those
    of :meth:`WriteAheadLog.append_waiting` (a wait entry: ``label_ids`` are its rows' ids,
    as in :class:`LogEntry`), or with ``config`` those of :meth:`WriteAheadLog.append_birth`.
    """

    name: str
    features: np.ndarray
    labels: np.ndarray | None = None
    idempotency_keys: Sequence[str | None] | None = None
    request_rows: Sequence[int] | None = None
    request_digests: Sequence[str | None] | None = None
    label_ids: Sequence[str] = ()
    follows: str | None = ANY_END
    start: int | None = None
    predictions: np.ndarray | None = None  # wait entry: (n, num_classes)
    expires_at: float = 0.0  # wait entry
    expired_ids: Sequence[str] = ()  # wait entry
    config: Mapping[str, Any] | None = None  # birth entry

    @property
    def waiting(self) -> bool:
        """True for a wait entry (rows put to wait for their labels)."""
        return self.predictions is not None


class LoggedRequest(NamedTuple):
    """What the log remembers of an idempotency key: its entry, and its request's digest.

    ``digest`` is None when the append carried none (a log written before digests were kept).
    """

    entry_id: str
    digest: str | None


@runtime_checkable
class WriteAheadLog(Protocol):
    """The interface the service uses; both implementations are synchronous and thread-safe."""

    def append(
        self,
        name: str,
        features: np.ndarray,
        labels: np.ndarray,
        idempotency_keys: Sequence[str | None] | None = None,
        request_rows: Sequence[int] | None = None,
        request_digests: Sequence[str | None] | None = None,
        label_ids: Sequence[str] = (),
        *,
        follows: str | None = ANY_END,
        start: int | None = None,
    ) -> str:
        """Log one chunk (``features`` (n, d) floats, ``labels`` (n,) ints) durably; its id.

        ``start``: how many examples the model had learned before this chunk, which a replay
        checks (:attr:`LogEntry.start`).

        ``idempotency_keys`` has one item per request of the chunk (None where a request has
        no key). A key already remembered keeps its original entry id; callers check
        :meth:`logged_requests` first so that a retried request is not logged (or learned)
        again.
        ``request_rows`` (optional, one count per request, summing to n) records how the
        chunk splits into requests, so that a replay can give each request its own answer.
        ``request_digests`` (optional, one per request, like the keys) is remembered with
        each key, so that :meth:`logged_requests` can tell a retry from a reused key.
        ``label_ids`` names the waiting rows (delayed labels) the chunk learns.
        ``follows``: the id of the newest entry the caller knows the log to hold (None: no
        entry); if the log's newest entry is another, or one of ``idempotency_keys`` is
        logged already, nothing is logged and :class:`WalDivergedError` says so. ``ANY_END``
        (the default) checks neither.
        """
        ...

    def append_waiting(
        self, name: str, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray,
        expires_at: float, expired_ids: Sequence[str] = (), *, follows: str | None = ANY_END,
    ) -> str:
        """Log rows put to wait for their labels (a wait entry) durably; its id.

        ``expired_ids`` names the waiting rows dropped once these are put (their wait ended,
        or too many wait); an entry of no rows logs a drop alone. ``follows`` as for
        :meth:`append`.
        """
        ...

    def append_birth(self, name: str, config: Mapping[str, Any], *,
                     follows: str | None = None) -> str:
        """Log a model's birth durably (its configuration, JSON, no rows); its id. What makes a
        new model durable where the log can list its models (:class:`ModelListing`): its first
        snapshot is then the next periodic (or shutdown) one, and a restore that finds the
        birth and no snapshot builds the model from it and replays what follows. ``follows``
        as for :meth:`append` (None: the log holds nothing of ``name``)."""
        ...

    def append_many(self, appends: Sequence[LogAppend]) -> list[str | Exception]:
        """Log several appends (of many models, or several of one, in order) together, each
        as :meth:`append` or :meth:`append_waiting` would; one result per append, in order:
        its entry id, or the exception that refused it (a ``ValueError`` for bad arguments,
        :class:`WalDivergedError` for a ``follows`` that does not hold, a failed write),
        which leaves the others logged. The file log writes them with one write and one
        fdatasync."""
        ...

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """Entries strictly after ``after_id`` (all of them for None), oldest first.

        Raises :class:`WalGapError` if entries after ``after_id`` were already trimmed.
        """
        ...

    def trim_through(self, name: str, entry_id: str) -> None:
        """Drop every entry up to and including ``entry_id`` (ids keep increasing after)."""
        ...

    def continue_after(self, name: str, entry_id: str) -> None:
        """Make the log's newest id at least ``entry_id``, so that every later entry follows
        it: for a log that is behind the model's snapshot (a log directory moved or
        emptied), whose new entries would otherwise get ids the snapshot already covers and
        that a restore would skip. Entries up to ``entry_id`` count as trimmed."""
        ...

    def last_id(self, name: str) -> str | None:
        """Id of the newest entry ever appended (even if trimmed since), None if none."""
        ...

    def reaches(self, name: str, entry_id: str) -> bool:
        """True when the log's newest entry (trimmed or not) is ``entry_id`` or a later one:
        False once a failover has lost it."""
        ...

    def seen_key(self, name: str, key: str) -> str | None:
        """The id of the entry logged with idempotency ``key`` within the TTL, else None."""
        ...

    def seen_keys(self, name: str, keys: Sequence[str | None]) -> list[str | None]:
        """:meth:`seen_key` for many keys at once (None stays None), in one round trip."""
        ...

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """Entry and digest of each key logged within the TTL (None otherwise), in one trip."""
        ...

    def delete(self, name: str) -> None:
        """Remove the model's log and remembered keys; a no-op for an unknown name."""
        ...

    def wait_durable(self) -> None:
        """Return once everything logged so far is as durable as an acknowledged append (on
        the replicas, fsynced, as configured); WalDurabilityError if it is not in time."""
        ...

    def reconnect(self) -> None:
        """Connect afresh before the next call (to the primary the Sentinels name now)."""
        ...

    def check_durability(self) -> None:
        """Raise WalDurabilityError if the configured durability cannot be had (start-up)."""
        ...

    def ping(self) -> bool:
        """True when the log can be written right now; never raises."""
        ...

    def close(self) -> None:
        """Release connections or file handles."""
        ...


@runtime_checkable
class ModelListing(Protocol):
    """A log that can name the models it holds entries of (the file log from its index, the
    Redis log from a SCAN of its streams)."""

    def names(self) -> list[str]:
        """The models with entries in the log, sorted."""
        ...


def append_one(wal: WriteAheadLog, item: LogAppend) -> str:
    """``item`` logged by ``wal.append``, ``wal.append_waiting`` or ``wal.append_birth``; its
    id."""
    if item.config is not None:
        return wal.append_birth(item.name, item.config, follows=item.follows)
    if item.waiting:
        assert item.predictions is not None
        return wal.append_waiting(item.name, item.label_ids, item.features, item.predictions,
                                  item.expires_at, item.expired_ids, follows=item.follows)
    return wal.append(item.name, item.features, item.labels,  # type: ignore[arg-type]
                      item.idempotency_keys, item.request_rows, item.request_digests,
                      item.label_ids, follows=item.follows, start=item.start)


class AppendEach:
    """``append_many`` as one append after another, for a log with no cheaper way to log
    many at once (each append is then as durable, and as slow, as alone)."""

    def append_many(self, appends: Sequence[LogAppend]) -> list[str | Exception]:
        """Each item by :func:`append_one`, in order; an item's exception is its result."""
        results: list[str | Exception] = []
        for item in appends:
            try:
                results.append(append_one(self, item))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - the item's result, as documented
                results.append(exc)
        return results
