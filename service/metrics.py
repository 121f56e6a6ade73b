"""Every Prometheus metric of the service, defined once, on a registry owned by one app.

The names and labels are a contract with the Grafana dashboard (docs/interfaces.md). Each app
gets its own :class:`ServiceMetrics` (and so its own ``CollectorRegistry``), which lets tests
build several apps in one process without "duplicated timeseries" errors.

The model name is the only per-model label; :meth:`ServiceMetrics.forget_model` removes a
model's series when the model is deleted, so label values stay bounded by the live models.
"""

from __future__ import annotations

import contextlib
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
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric

# 100 us .. 30 s: a single-example request is well under a millisecond when the model is
# small, and a 100-row learn of the MNIST network takes seconds on two cores.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
)
SNAPSHOT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class _ModelCounters:
    """One model's children of the per-model counters."""

    learned: Counter
    log_loss: Counter
    correct: Counter
    predicted: Counter


def package_version() -> str:
    """The installed gln-service version, or ``"unknown"`` when running from a bare checkout."""
    try:
        return metadata.version("gln-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class ServiceMetrics:
    """The service's metrics on a private registry; render them with :meth:`render`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, device: str, version: str | None = None, http: bool = True) -> None:
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
        self.examples_learned = Counter(
            "gln_examples_learned", "Examples learned.", ["model"], registry=r,
        )
        self.log_loss = Counter(
            "gln_prequential_log_loss_nats",
            "Sum of prequential log loss (nats): each example is scored before it is learned.",
            ["model"], registry=r,
        )
        self.correct = Counter(
            "gln_prequential_correct",
            "Prequential correct predictions (argmax before the update equals the label).",
            ["model"], registry=r,
        )
        self.examples_predicted = Counter(
            "gln_examples_predicted", "Rows answered by predict.", ["model"], registry=r,
        )
        self.models_loaded = Gauge("gln_models_loaded", "Models held in memory.", registry=r)
        self.ready = Gauge(
            "gln_ready", "1 once the stored models are restored (/readyz answers 200), else 0.",
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
        self.model_bytes = Gauge(
            "gln_model_bytes", "Bytes held by a model's arrays.", ["model"], registry=r,
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
        self.snapshot_bytes = Gauge(
            "gln_snapshot_bytes", "Size of a model's latest snapshot.", ["model"], registry=r,
        )
        self.snapshot_last_success = Gauge(
            "gln_snapshot_last_success_timestamp_seconds",
            "Unix time of a model's latest successful snapshot.", ["model"], registry=r,
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
        self.labels_learned = Counter(
            "gln_delayed_labels_learned",
            "Predicted rows learned when their label arrived.", ["model"], registry=r,
        )
        self.labels_expired = Counter(
            "gln_delayed_labels_expired",
            "Predicted rows whose label did not come in time (dropped, or learned with "
            "GLN_LABEL_DEFAULT).", ["model"], registry=r,
        )
        self.labels_pending = Gauge(
            "gln_delayed_labels_pending", "Predicted rows waiting for their label.",
            ["model"], registry=r,
        )
        self.build_info = Gauge(
            "gln_build_info", "Version and device of this process (value 1).",
            ["version", "device"], registry=r,
        )
        self._version = version or package_version()
        self.show_device(device)
        # Each model's learn/predict counters, looked up once: ``.labels(...)`` costs a lock
        # and a dict lookup per metric, and predict counts on every request.
        self._counters: dict[str, _ModelCounters] = {}

    # -- per-model series -------------------------------------------------------------------
    def _per_model(self) -> tuple[Counter | Gauge, ...]:
        return (
            self.examples_learned, self.log_loss, self.correct, self.examples_predicted,
            self.model_bytes, self.snapshot_bytes, self.snapshot_last_success,
            self.labels_learned, self.labels_expired, self.labels_pending,
        )

    def add_model(self, name: str, nbytes: Callable[[], int]) -> None:
        """Start a model's series at zero so dashboards show it before its first example;
        its bytes are read at each scrape (a CPU model grows on its first short call)."""
        for metric in (self.examples_learned, self.log_loss, self.correct,
                       self.examples_predicted, self.labels_learned, self.labels_expired):
            metric.labels(model=name)
        self.model_bytes.labels(model=name).set_function(nbytes)
        self.labels_pending.labels(model=name).set(0)

    def _model_counters(self, name: str) -> _ModelCounters:
        counters = self._counters.get(name)
        if counters is None:
            counters = _ModelCounters(
                learned=self.examples_learned.labels(model=name),
                log_loss=self.log_loss.labels(model=name),
                correct=self.correct.labels(model=name),
                predicted=self.examples_predicted.labels(model=name),
            )
            self._counters[name] = counters
        return counters

    def forget_model(self, name: str) -> None:
        """Remove every series labelled with this model (it was deleted)."""
        self._counters.pop(name, None)
        # The bytes callback holds the model, and prometheus_client keeps it in a reference
        # cycle that outlives ``remove``: only a full collection (rare, see __main__) would
        # free the deleted model's memory. Dropping the callback frees it at once.
        self.model_bytes.labels(model=name).set_function(lambda: 0)
        for metric in self._per_model():
            with contextlib.suppress(KeyError):
                metric.remove(name)

    def observe_learned(self, name: str, n: int, log_loss_sum: float, correct: int) -> None:
        """Count one learned chunk: examples, summed prequential log loss, correct guesses."""
        counters = self._model_counters(name)
        counters.learned.inc(n)
        counters.log_loss.inc(log_loss_sum)
        counters.correct.inc(correct)

    def observe_predicted(self, name: str, n: int) -> None:
        """Count rows answered by predict."""
        self._model_counters(name).predicted.inc(n)

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
        self.snapshot_bytes.labels(model=name).set(nbytes)
        self.snapshot_last_success.labels(model=name).set(at)

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
