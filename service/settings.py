"""Service configuration: one settings object, read from ``GLN_*`` environment variables.

Every knob of the service lives here so that a reader finds them in one place, and so that
tests can build an app with explicit settings (``create_app(Settings(...))``) instead of
patching the environment.

>>> Settings(port=9000).port
9000
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gln.serialize import MAX_HEADER_BYTES
from service.storage.common import SENTINEL_SCHEME, parse_nats_url, parse_sentinel_url

MIB = 1024 * 1024
# Room for a model blob's header: magic, length and the JSON the library parses at most.
IMPORT_HEADER_BYTES = MAX_HEADER_BYTES + 64


class Settings(BaseSettings):
    """Configuration of one service process; each field is ``GLN_<FIELD>`` in the environment."""

    # An empty variable means unset: compose passes ``GLN_API_TOKEN=${GLN_API_TOKEN:-}``, and an
    # empty token must not turn auth half on (requests without a token pass, any token fails).
    model_config = SettingsConfigDict(env_prefix="GLN_", extra="ignore", env_ignore_empty=True)

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="Device for every model this process creates (passed to GLN)."
    )
    redis_url: str | None = Field(
        None,
        description="Redis URL for snapshots and the log (redis://host:6379/0), or the "
        "primary that Redis Sentinel names, followed through failovers "
        "(redis+sentinel://host:26379,host2:26379/name). Unset: use snapshot_dir.",
    )
    redis_key_prefix: str = Field("gln", description="Prefix of every Redis key the store uses.")
    snapshot_dir: str = Field(
        "./snapshots", description="Directory for snapshots when no Redis URL is set."
    )
    snapshot_interval_s: float = Field(
        60.0,
        gt=0,
        description="Seconds between periodic snapshots (only models changed since their last).",
    )
    wal_enabled: bool = Field(
        True,
        description="Log every learned chunk before answering it (write-ahead log), so a crash "
        "loses no acknowledged example. Off: only snapshots keep learning.",
    )
    wal_durability: Literal["everysec", "always", "waitaof"] = Field(
        "everysec",
        description="Redis log: when an append counts as done (docs/durability.md): in Redis "
        "memory (everysec), Redis fsyncs every write (always: needs appendfsync always), or "
        "WAITAOF confirms the fsync (waitaof: Redis >= 7.2 with appendonly yes).",
    )
    wal_replicas: int = Field(
        0, ge=0,
        description="Redis log: how many Redis replicas must have received each append before "
        "it is acknowledged (WAIT <n>), so that it outlives the loss of the primary's machine.",
    )
    wal_url: str | None = Field(
        None,
        description="The write-ahead log in a NATS JetStream cluster, replicated by Raft "
        "(nats://host1:4222,host2:4222,host3:4222; tls:// for TLS; user:password@ before the "
        "hosts): nothing acknowledged is lost while most of its servers are up. Snapshots "
        "still go to GLN_REDIS_URL or GLN_SNAPSHOT_DIR. Unset: the log goes with the snapshots.",
    )
    wal_stream_replicas: int | None = Field(
        None, ge=1, le=5,
        description="NATS log: replicas of its JetStream streams. Unset: 3 where the server is "
        "in a cluster, 1 where it is alone.",
    )
    wal_fsync: bool = Field(True, description="File log: fdatasync every append.")
    wal_dir: str | None = Field(
        None, description="Directory of the file log (no Redis). Unset: snapshot_dir."
    )
    idempotency_ttl_s: float = Field(
        86400.0, gt=0, description="How long a learn request's Idempotency-Key is remembered."
    )
    idempotency_cache_rows: int = Field(
        100_000,
        ge=0,
        description="Rows of original learn answers kept in memory, to answer a retried "
        "Idempotency-Key with the original probabilities.",
    )
    label_ttl_s: float = Field(
        3600.0, gt=0,
        description="How long a predicted row with an id waits for its label (delayed labels).",
    )
    max_pending_label_rows: int = Field(
        100_000, gt=0,
        description="Most predicted rows per model waiting for labels (the oldest expire first).",
    )
    label_default: int | None = Field(
        None, ge=0,
        description="Label learned for rows whose label never came; unset: drop them.",
    )
    max_models: int = Field(1000, gt=0, description="Most models one server holds.")
    max_total_model_bytes: int | None = Field(
        None, gt=0,
        description="Most bytes all models together may hold (GLN.estimate_nbytes). Unset: "
        "half the memory this process may use (the machine's, or its container's limit "
        "where lower), or 80% of the GPU's with GLN_DEVICE=cuda.",
    )
    api_token: SecretStr | None = Field(
        None,
        description="When set, POST and DELETE routes, and a model's export, need "
        "'Authorization: Bearer <token>'.",
    )
    token_for_reads: bool = Field(
        False,
        description="With api_token set, the GET /v1 routes need the token too (probes, "
        "/metrics and the OpenAPI pages stay open).",
    )
    allowed_hosts: str | None = Field(
        None,
        description="Host names the server answers to, comma-separated (the Host header; '*' "
        "for any). Unset: "
        "localhost, 127.0.0.1 and ::1 when listening on a loopback address (a web page cannot "
        "reach it through DNS rebinding), any host otherwise.",
    )
    max_body_bytes: int = Field(64 * MIB, gt=0, description="Largest accepted request body.")
    body_timeout_s: float = Field(
        30.0, gt=0,
        description="Longest wait for the next piece of a request body before answering 408: "
        "a client that stops sending holds no buffer for good.",
    )
    shutdown_snapshot_s: float = Field(
        15.0, gt=0,
        description="How long a shutdown spends on snapshots of changed models, those that "
        "learned the most first; the rest stay in the write-ahead log and are replayed at the "
        "next start (with the log disabled every changed model is written, however long).",
    )
    snapshot_keep: int = Field(
        3, ge=1, le=100,
        description="Snapshot versions kept of each model: a restore whose newest is damaged "
        "falls back to the newest whole one and replays the log from its entry (the log is "
        "trimmed only past the oldest kept).",
    )
    wal_timeout_s: float = Field(
        1.0, gt=0,
        description="Longest a Redis log call may take beyond what its confirmations wait for "
        "(WAITAOF, WAIT), or a NATS log call in all: a Redis (or a NATS leader) that hangs "
        "fails appends (503, Retry-After) in about this long, and no model's writer is held "
        "for longer.",
    )
    min_body_bytes_per_s: float = Field(
        32 * 1024, gt=0,
        description="Slowest pace a request body may arrive at, on average, after its first "
        "GLN_BODY_TIMEOUT_S: a body trickled a byte at a time gets 408 instead of holding "
        "its connection.",
    )
    header_timeout_s: float = Field(
        10.0, gt=0,
        description="Longest a connection may take to send a request's headers (from its "
        "start, or from the request's first byte); then 408 and the connection is closed.",
    )
    max_connections: int = Field(
        2048, gt=0,
        description="Connections (and requests in flight) one HTTP process serves at once; "
        "beyond them new requests get 503.",
    )
    max_large_bodies: int = Field(
        2, gt=0,
        description="Requests with a body over 1 MiB handled at once, once read; more wait "
        "their turn. Parsing a JSON body takes up to tens of times its size in memory, so this "
        "bounds what a burst of big requests can hold.",
    )
    max_buffered_bytes: int | None = Field(
        None, gt=0,
        description="Most bytes of request bodies held at once, being read or waiting for "
        "their turn; past it a request gets 503 (retry). Unset: the larger of an import's "
        "limit and 16 x GLN_MAX_BODY_BYTES (1 GiB by default).",
    )
    max_rows_per_request: int = Field(
        10_000, gt=0, description="Largest number of rows in one predict/learn/explain request."
    )
    max_response_values: int = Field(
        4 * MIB, gt=0,
        description="Most numbers one predict/learn/explain answer may hold (rows x classes, "
        "x features for explain): the answer is built in memory, so the row limit alone "
        "would let a small request of a many-class model ask for gigabytes.",
    )
    max_chunk_rows: int = Field(
        10_000,
        gt=0,
        description="Most rows the learn worker coalesces into one model.learn call.",
    )
    max_model_bytes: int = Field(
        1024 * MIB, gt=0,
        description="Largest model (GLN.estimate_nbytes) a client may create or import.",
    )
    metrics_models: int = Field(
        100, ge=0,
        description="Models whose metrics have series of their own (model=\"<name>\"), the "
        "first ones created or restored; the others are summed under model=\"(others)\", so "
        "that a server of many models keeps its metrics page small.",
    )
    recent_window: int = Field(
        1000, gt=0, description="Examples in the 'recent' window of a model's online metrics."
    )
    worker_threads: int = Field(
        4, gt=0, description="Threads that run model calls and snapshots off the event loop."
    )
    stream_max_in_flight: int = Field(
        8, ge=1, le=1024,
        description="Batches a learning stream (WebSocket) reads ahead of their answers; "
        "beyond that the server stops reading and the client's sends wait.",
    )
    workers: int = Field(
        1, ge=1, le=256,
        description="HTTP worker processes. 1: one process serves HTTP and holds the models. "
        "More: that many processes parse and check requests and hand the rows to one engine "
        "process, which holds the models (worth it when parsing, not learning, is the limit: "
        "a GPU server, or many small requests).",
    )
    restore_wait_s: float = Field(
        10.0,
        gt=0,
        description="How long a request for a model not loaded yet waits for start-up restore "
        "before answering 503.",
    )
    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="Seconds uvicorn waits for open requests on SIGTERM."
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(False, description="Log every request (metrics already count them).")

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_in_any_case(cls, level: object) -> object:
        return level.lower() if isinstance(level, str) else level

    @field_validator("redis_url")
    @classmethod
    def _sentinel_url_is_whole(cls, url: str | None) -> str | None:
        if url is not None and url.startswith(f"{SENTINEL_SCHEME}://"):
            parse_sentinel_url(url)  # ValueError names what is wrong
        return url

    @field_validator("wal_url")
    @classmethod
    def _nats_url_is_whole(cls, url: str | None) -> str | None:
        if url is not None:
            parse_nats_url(url)  # ValueError names what is wrong
        return url

    @model_validator(mode="after")
    def _replicas_need_redis(self) -> Self:
        if self.wal_replicas and not self.redis_url:
            raise ValueError("GLN_WAL_REPLICAS needs the Redis log: set GLN_REDIS_URL")
        return self

    @model_validator(mode="after")
    def _nats_log_settings(self) -> Self:
        """The Redis log's settings mean nothing to the NATS log (its replicas are
        GLN_WAL_STREAM_REPLICAS), and the NATS log's nothing without it: refused, not
        ignored. GLN_REDIS_KEY_PREFIX names the NATS streams too."""
        if not self.wal_url:
            if self.wal_stream_replicas is not None:
                raise ValueError("GLN_WAL_STREAM_REPLICAS needs the NATS log: set GLN_WAL_URL")
            return self
        redis_only = [f"GLN_{name.upper()}" for name in ("wal_replicas", "wal_durability")
                      if name in self.model_fields_set]
        if redis_only:
            raise ValueError(f"{' and '.join(redis_only)} set the Redis log, not the NATS log "
                             "of GLN_WAL_URL (its replicas: GLN_WAL_STREAM_REPLICAS)")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", self.redis_key_prefix):
            raise ValueError(
                "GLN_REDIS_KEY_PREFIX names the NATS log's streams too (GLN_WAL_URL): 1-32 "
                f"characters from [A-Za-z0-9_-], got {self.redis_key_prefix!r}")
        return self

    @model_validator(mode="after")
    def _log_dir_apart_from_snapshots(self) -> Self:
        """The file log's directory is the snapshot directory or lies outside it: each
        holds one subdirectory per model, so a log directory inside the snapshots would be
        a model's directory, deleted with a model of its name (and the other way round)."""
        if self.redis_url or self.wal_url or not self.wal_dir:
            return self
        snapshots, log = Path(self.snapshot_dir).resolve(), Path(self.wal_dir).resolve()
        if snapshots != log and (snapshots in log.parents or log in snapshots.parents):
            raise ValueError(
                f"GLN_WAL_DIR ({self.wal_dir}) and GLN_SNAPSHOT_DIR ({self.snapshot_dir}) must "
                "be the same directory or apart, not one inside the other: each holds a "
                "directory per model")
        return self

    @property
    def buffered_bytes_limit(self) -> int:
        """``max_buffered_bytes``, or its default: room for the largest import, or for 16
        bodies of the largest size."""
        return self.max_buffered_bytes or max(self.import_max_bytes, 16 * self.max_body_bytes)

    @property
    def import_max_bytes(self) -> int:
        """Largest body a model import accepts: the blob of a model of ``max_model_bytes``.

        A blob's arrays are the model's, less the copy of the normals that ``estimate_nbytes``
        counts on top, so they fit in ``max_model_bytes``; its header (the config and the
        arrays' names and shapes) gets ``IMPORT_HEADER_BYTES`` more.
        """
        return max(self.max_body_bytes, self.max_model_bytes + IMPORT_HEADER_BYTES)

    @property
    def allowed_host_names(self) -> list[str] | None:
        """``allowed_hosts`` as a list of names; None when unset."""
        if self.allowed_hosts is None:
            return None
        return [name.strip() for name in self.allowed_hosts.split(",") if name.strip()]

    def summary(self, device: str | None = None) -> str:
        """One line of what this process runs with, for its start-up log: where snapshots and
        the log go, how durable, the device (``device``: what "auto" resolved to) and the
        guards (a Redis URL's password hidden)."""
        if self.redis_url:
            store = f"redis {_without_password(self.redis_url)} (prefix {self.redis_key_prefix!r})"
            log = f"Redis stream, durability {self.wal_durability}, replicas {self.wal_replicas}"
        if self.wal_url:
            replicas = self.wal_stream_replicas or "3 in a cluster, 1 alone"
            log = (f"NATS JetStream {_without_password(self.wal_url)} (streams "
                   f"{self.redis_key_prefix}-wal*), stream replicas {replicas}")
        if not self.redis_url:
            store = f"directory {Path(self.snapshot_dir).resolve()}"
            if not self.wal_url:
                wal_dir = Path(self.wal_dir or self.snapshot_dir).resolve()
                log = f"file in {wal_dir}, fsync {'on' if self.wal_fsync else 'off'}"
        resolved = f" ({device})" if device is not None and device != self.device else ""
        return (f"listening on {self.host}:{self.port}, device {self.device}{resolved}; "
                "snapshots to "
                f"{store} every {self.snapshot_interval_s:g} s; write-ahead log: "
                f"{log if self.wal_enabled else 'off'}; bearer token "
                f"{'required' if self.api_token else 'off'}")


# GLN_ variables that are not settings of the service but are known to the project (the data
# directory of the benchmarks, what gln-service tells its HTTP workers): no warning for them.
OTHER_VARIABLES = frozenset({"GLN_DATA_DIR", "GLN_ENGINE_ADDRESS", "GLN_WORKERS_METRICS_DIR"})


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``GLN_`` variable of ``environ`` that is no setting, naming the
    setting it most looks like: a misspelt ``GLN_REDIS_URI`` would otherwise leave the server
    on its defaults (snapshots in a local directory) without a word."""
    known = {f"GLN_{name.upper()}" for name in Settings.model_fields}
    warnings = []
    for variable in sorted(environ):  # settings are read whatever their case
        if variable.upper().startswith("GLN_") and variable.upper() not in known | OTHER_VARIABLES:
            close = difflib.get_close_matches(variable.upper(), sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"{variable} is not a setting and is ignored{hint}")
    return warnings


def _without_password(url: str) -> str:
    """``url`` with the password of its user part, and any ``...password=`` query value,
    replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is not None:
        user = f"{parts.username}:***@" if parts.username else ":***@"
        parts = parts._replace(netloc=user + parts.netloc.rpartition("@")[2])
    query = "&".join(
        f"{key}=***" if "password" in key.lower() else f"{key}={value}" if sep else key
        for key, sep, value in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit(parts._replace(query=query))
