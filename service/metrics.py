"""Every Prometheus metric of the service, defined once, on a registry owned by one app.

The names and labels are a contract with the Grafana dashboard (docs/interfaces.md). Each app
gets its own :class:`ServiceMetrics` (and so its own ``CollectorRegistry``), which lets tests
build several apps in one process without "duplicated timeseries" errors.

The model name is the only per-model label, and bounded: the first ``GLN_METRICS_MODELS``
models have series of their own, the others are summed under ``model="(others)"``
(:class:`ModelSeries`); a deleted model's series go with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

# No ``_created`` series: a timestamp per counter and histogram that no dashboard reads (6 of
# each model's 16 series were these).
disable_created_metrics()

# 100 us .. 30 s: a single-example request is well under a millisecond when the model is
# small, and a 100-row learn of the MNIST network takes seconds on two cores.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
)
SNAPSHOT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)


def package_version() -> str:
    """The installed gln-service version, or ``"unknown"`` when running from a bare checkout."""
    try:
        return metadata.version("gln-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class ServiceMetrics:
    """The service's metrics on a private registry; render them with :meth:`render`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, device: str, version: str | None = None, http: bool = True,
                 models_with_series: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The process's memory, CPU time and open files (process_*), on Linux.
        ProcessCollector(registry=r)
        # An engine process of its own answers no HTTP: its workers count the requests
        # (workers_http_metrics), so its page leaves them out.
        h = r if http else CollectorRegistry()
        self.http_requests = Counter(
            "gln_http_requests", "HTTP requests answered.",
            ["route", "method", "status"], registry=h,
        )
        self.http_duration = Histogram(
            "gln_http_request_duration_seconds",
            "Time to answer an HTTP request; status_class is its status' class (2xx, 4xx, ...).",
            ["route", "method", "status_class"], buckets=LATENCY_BUCKETS, registry=h,
        )
        self.models_loaded = Gauge("gln_models_loaded", "Models held in memory.", registry=r)
        self.ready = Gauge(
            "gln_ready", "1 once the stored models are listed, each then loaded on demand "
            "(/readyz answers 200), else 0.",
            registry=r,
        )
        self.store_up = Gauge(
            "gln_store_up",
            "1 when the snapshot store and the write-ahead log answered the latest ping (taken "
            "at each scrape), else 0: without them nothing is learned or snapshotted.",
            registry=r,
        )
        self.models_unrestored = Gauge(
            "gln_models_unrestored",
            "Stored models that could not be restored (not served until fixed or deleted).",
            registry=r,
        )
        self.snapshot_duration = Histogram(
            "gln_snapshot_duration_seconds", "Time to serialise and store one snapshot.",
            buckets=SNAPSHOT_BUCKETS, registry=r,
        )
        self.snapshot_fallbacks = Counter(
            "gln_snapshot_fallbacks",
            "Restores that found a model's newest snapshot damaged and loaded an older one "
            "kept (GLN_SNAPSHOT_KEEP), then the log after it.", registry=r,
        )
        self.snapshot_failures = Counter(
            "gln_snapshot_failures",
            "Snapshots that could not be stored (periodic, asked for, or a new model's first).",
            registry=r,
        )
        self.wal_append_duration = Histogram(
            "gln_wal_append_duration_seconds",
            "Time to append one learn chunk to the write-ahead log (durably, as configured).",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.wal_append_errors = Counter(
            "gln_wal_append_errors",
            "Write-ahead log calls of the learn path that failed (their requests got 503).",
            registry=r,
        )
        self.wal_replayed_entries = Counter(
            "gln_wal_replayed_entries",
            "Log entries applied from the log itself: start-up replay, or catching up after a "
            "failed append.", registry=r,
        )
        self.wal_rebuilds = Counter(
            "gln_wal_rebuilds",
            "Models rebuilt from their snapshot and log because the log had lost entries they "
            "had learned (a Redis failover to a replica that lacked them).", registry=r,
        )
        self.wal_replayed_examples = Counter(
            "gln_wal_replayed_examples", "Examples in the replayed log entries.", registry=r,
        )
        self.learn_duplicates = Counter(
            "gln_learn_duplicates",
            "Learn requests not learned again because their Idempotency-Key was already logged.",
            registry=r,
        )
        self.build_info = Gauge(
            "gln_build_info", "Version and device of this process (value 1).",
            ["version", "device"], registry=r,
        )
        self._version = version or package_version()
        self.show_device(device)
        # Each model's series, kept as plain numbers and written out at each scrape.
        self.models = ModelSeries(models_with_series)
        r.register(self.models)

    def add_model(self, name: str, nbytes: Callable[[], int]) -> None:
        """Start a model's series at zero so dashboards show it before its first example;
        its bytes are read at each scrape (a CPU model grows on its first short call)."""
        self.models.add(name, nbytes)

    def forget_model(self, name: str) -> None:
        """Remove the model's series (it was deleted); what it counted stays counted in
        ``model="(others)"`` if it had no series of its own."""
        self.models.forget(name)

    def observe_learned(self, name: str, n: int, log_loss_sum: float, correct: int) -> None:
        """Count one learned chunk: examples, summed prequential log loss, correct guesses."""
        self.models.count(name, learned=n, log_loss=log_loss_sum, correct=correct)

    def observe_predicted(self, name: str, n: int) -> None:
        """Count rows answered by predict."""
        self.models.count(name, predicted=n)

    def count_labels_learned(self, name: str, n: int) -> None:
        """Count predicted rows learned when their label came."""
        self.models.count(name, labels_learned=n)

    def count_labels_expired(self, name: str, n: int) -> None:
        """Count predicted rows whose label did not come in time."""
        self.models.count(name, labels_expired=n)

    def show_labels_pending(self, name: str, n: int) -> None:
        """Export how many of the model's predicted rows wait for their label."""
        self.models.of(name).labels_pending = n

    def labels_pending_shown(self, name: str) -> int:
        """The model's rows waiting for their label, as last shown."""
        return self.models.of(name).labels_pending

    def show_device(self, device: str) -> None:
        """``gln_build_info``'s device: the one models run on ("auto" resolved once known)."""
        self.build_info.clear()
        self.build_info.labels(version=self._version, device=device).set(1)

    def observe_snapshot(self, name: str, seconds: float, nbytes: int, at: float) -> None:
        """Record one successful snapshot of a model, taken at unix time ``at``."""
        self.snapshot_duration.observe(seconds)
        self.show_snapshot(name, nbytes, at)

    def show_snapshot(self, name: str, nbytes: int, at: float) -> None:
        """Export the size and time of a model's latest snapshot, also one restored at start-up
        (without it a restarted model has no snapshot age, and the stale alert cannot fire)."""
        counts = self.models.of(name)
        counts.snapshot_bytes, counts.snapshot_at = nbytes, at

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)


def count_across_processes(directory: str) -> None:
    """Make this process's metrics, made after this call, count in files under ``directory``
    that every HTTP worker shares (prometheus_client's multiprocess mode), so that any worker's
    page shows all workers' requests (:func:`workers_http_metrics`)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue()


def workers_http_metrics(directory: str) -> bytes:
    """Every HTTP worker's ``gln_http_*`` metrics, summed, in text exposition format."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return generate_latest(_Only(registry, "gln_http_"))


class _Only:
    """The metric families of ``registry`` whose names start with ``prefix``."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.registry, self.prefix = registry, prefix

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.registry.collect()
                if family.name.startswith(self.prefix))


OTHERS = "(others)"  # the model label of the models without series of their own (no model's name)


def _no_bytes() -> int:
    return 0


@dataclass
class _Counts:
    """One model's counts and gauges, as plain numbers (each written by one thread at a time:
    its writer, or the event loop)."""

    learned: float = 0.0
    log_loss: float = 0.0
    correct: float = 0.0
    predicted: float = 0.0
    labels_learned: float = 0.0
    labels_expired: float = 0.0
    labels_pending: int = 0
    snapshot_bytes: float | None = None
    snapshot_at: float | None = None
    nbytes: Callable[[], int] = _no_bytes
    own_series: bool = True
    bytes_seen: int = 0  # nbytes() when last read (models summed under (others))


# (family name, help, _Counts field) of each per-model counter, then of each gauge.
_COUNTERS = (
    ("gln_examples_learned", "Examples learned.", "learned"),
    ("gln_prequential_log_loss_nats",
     "Sum of prequential log loss (nats): each example is scored before it is learned.",
     "log_loss"),
    ("gln_prequential_correct",
     "Prequential correct predictions (argmax before the update equals the label).", "correct"),
    ("gln_examples_predicted", "Rows answered by predict.", "predicted"),
    ("gln_delayed_labels_learned", "Predicted rows learned when their label arrived.",
     "labels_learned"),
    ("gln_delayed_labels_expired",
     "Predicted rows whose label did not come in time (dropped, or learned with "
     "GLN_LABEL_DEFAULT).", "labels_expired"),
)


class ModelSeries:
    """The per-model series, bounded: the first ``limit`` models (created or restored) export
    series of their own, labelled with their name; the others are summed under
    ``model="(others)"`` (their snapshot time is the oldest of theirs, so the stale-snapshot
    alert still fires for any of them). A page of 10,000 models is then a few hundred series,
    not 160,000.

    Cheap at any count: the others' counters are summed as they count (a deleted model's
    counts stay in the sum: counters never go down), and their bytes, which change at most
    once in a model's life (its first call makes a copy of the normals), are read for
    ``BYTES_READ_PER_SCRAPE`` of them a scrape, in turn.

    A prometheus_client collector: :meth:`collect` writes the families at each scrape.
    """

    BYTES_READ_PER_SCRAPE = 1000

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._models: dict[str, _Counts] = {}
        self._own = 0  # models with series of their own
        self._others = _Counts()  # the counters of every model without series of its own
        self._unknown = _Counts()  # a count for a model deleted meanwhile lands here, unseen
        self._bytes_from = 0  # where the next scrape's reading of the others' bytes starts

    def add(self, name: str, nbytes: Callable[[], int]) -> None:
        own = self._own < self.limit
        self._own += own
        self._models[name] = _Counts(nbytes=nbytes, own_series=own, bytes_seen=nbytes())

    def forget(self, name: str) -> None:
        counts = self._models.pop(name, None)
        if counts is None:
            return
        counts.nbytes = _no_bytes  # the callback holds the model: let it go at once
        self._own -= counts.own_series

    def of(self, name: str) -> _Counts:
        """The model's counts (a scratch record for a model deleted meanwhile)."""
        return self._models.get(name) or self._unknown

    def count(self, name: str, **increments: float) -> None:
        """Add ``increments`` (counter field -> amount) to the model's counters."""
        counts = self._models.get(name)
        if counts is None:
            return
        for field, amount in increments.items():
            setattr(counts, field, getattr(counts, field) + amount)
            if not counts.own_series:
                setattr(self._others, field, getattr(self._others, field) + amount)

    def collect(self) -> Iterator[Metric]:
        models = list(self._models.items())  # one copy, in C: safe beside the loop's changes
        own = [(name, counts) for name, counts in models if counts.own_series]
        others = [counts for _, counts in models if not counts.own_series]
        summed = bool(others) or any(getattr(self._others, field) for _, _, field in _COUNTERS)
        for family, doc, field in _COUNTERS:
            metric = CounterMetricFamily(family, doc, labels=["model"])
            for name, counts in own:
                metric.add_metric([name], getattr(counts, field))
            if summed:
                metric.add_metric([OTHERS], getattr(self._others, field))
            yield metric
        model_bytes = GaugeMetricFamily("gln_model_bytes", "Bytes held by a model's arrays.",
                                        labels=["model"])
        pending = GaugeMetricFamily("gln_delayed_labels_pending",
                                    "Predicted rows waiting for their label.", labels=["model"])
        snapshot_bytes = GaugeMetricFamily("gln_snapshot_bytes",
                                           "Size of a model's latest snapshot.", labels=["model"])
        snapshot_at = GaugeMetricFamily(
            "gln_snapshot_last_success_timestamp_seconds",
            "Unix time of a model's latest successful snapshot (of (others): the oldest).",
            labels=["model"])
        for name, counts in own:
            model_bytes.add_metric([name], counts.nbytes())
            pending.add_metric([name], counts.labels_pending)
            if counts.snapshot_at is not None:
                snapshot_bytes.add_metric([name], counts.snapshot_bytes or 0)
                snapshot_at.add_metric([name], counts.snapshot_at)
        if others:
            start = self._bytes_from % len(others)
            for counts in others[start:start + self.BYTES_READ_PER_SCRAPE]:
                counts.bytes_seen = counts.nbytes()
            self._bytes_from = start + self.BYTES_READ_PER_SCRAPE
            model_bytes.add_metric([OTHERS], sum(counts.bytes_seen for counts in others))
            pending.add_metric([OTHERS], sum(counts.labels_pending for counts in others))
            snapshotted = [counts for counts in others if counts.snapshot_at is not None]
            if snapshotted:
                snapshot_bytes.add_metric([OTHERS], sum(c.snapshot_bytes or 0 for c in snapshotted))
                snapshot_at.add_metric([OTHERS], min(c.snapshot_at or 0 for c in snapshotted))
        yield from (model_bytes, pending, snapshot_bytes, snapshot_at)
