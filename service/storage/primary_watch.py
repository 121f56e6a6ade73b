"""Which server the Redis Sentinels name the primary, and whether a failover may be under way
(:class:`PrimaryWatch`), for the clients of a ``redis+sentinel://`` URL (common.py).

Redis replication is not consensus. A primary that pauses (a long GC-like stall, ``kill
-STOP``, a partition) while the Sentinels promote a replica goes on answering as a primary when
it resumes, with a replica perhaps still attached whose acknowledgement satisfies ``WAIT``;
when the Sentinels repoint that replica and the old primary, what they took is gone. So a
client that only asks the Sentinels at connect time keeps writing to the old primary, and
``WAIT`` alone cannot tell it that its writes will be discarded.

The watch listens to every Sentinel's events (pub/sub, a thread each) and keeps:

* the address the Sentinels name (from ``+switch-master``, and from asking them,
  ``SENTINEL GET-MASTER-ADDR-BY-NAME``, preferring the newest configuration epoch), which new
  connections use and which pooled connections are dropped for (``on_change``);
* whether it is *settled*: no event since the Sentinels last agreed that a failover might be
  under way. A Sentinel voting for a failover leader (``+vote-for-leader``, ``+new-epoch``:
  published by every voter, and a leader needs a majority of votes), the leader's
  ``+odown``, ``+try-failover`` and ``+elected-leader``, ``+promoted-slave`` and
  ``+switch-master`` unsettle it; it settles again once the Sentinels it can ask (at least
  the subscriptions it needs, below) name one address at the newest epoch, none sees the
  primary objectively down or a failover in progress, and, where a failover was attempted
  and it would settle back on the old primary, every Sentinel answered (the leader is not
  merely out of reach) or the Sentinels' ``failover-timeout`` has passed since.

A write is safe to acknowledge when the watch was settled, at one :meth:`token`, from before
the write until after its ``WAIT`` (:meth:`confirms`). Why that closes the pause window: a
replica is promoted (``REPLICAOF NO ONE``) only after a leader is elected by a majority of
the Sentinels, each voter publishing its vote first, and a leader moves through its failover
states one Sentinel tick (100 ms) at a time (measured here: the votes 170 ms before the
promotion, the +switch-master 1.1 s after them). The watch holds live subscriptions to at
least ``ceil(N/2)`` of the N Sentinels listed, so it hears at least one voter of every
majority. A write that the old primary took after the promotion had its ``WAIT`` answered
later still, and is refused unless the watch's thread got a vote more than that tick late.
Asking a Sentinel per append would not do better (a Sentinel that did not lead the failover
names the old primary until the leader's hello reaches it), and costs a round trip each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from redis.sentinel import MasterNotFoundError

log = logging.getLogger(__name__)

# Each subscription pings its Sentinel this often, and counts as lost when it heard nothing for
# LIVE_S (a Sentinel that hangs, or a partition): its events could go unheard.
PING_S = 0.5
LIVE_S = 2.0
# How often the Sentinels are asked while a failover may be under way: the outage after a
# failover is the Sentinels' own plus at most this.
SETTLE_POLL_S = 0.05

# Events that say a failover may be under way (or has happened) for the watched primary.
# '+new-epoch' and '+vote-for-leader' name no primary (their payload is the epoch, the
# leader's id): they count for every primary of those Sentinels.
_UNNAMED = ("+new-epoch", "+vote-for-leader")
_ATTEMPTS = (*_UNNAMED, "+try-failover", "+elected-leader", "+promoted-slave")
_CHANNELS = (*_ATTEMPTS, "+odown", "+switch-master", "+reset-master", "-monitor")
# Flags of a Sentinel's view of the primary under which it is not settled.
_UNSETTLED_FLAGS = frozenset({"o_down", "failover_in_progress"})

Address = tuple[str, int]


@dataclass(frozen=True)
class SentinelTarget:
    """Where a ``redis+sentinel://`` URL points: the Sentinels to ask (and their password,
    if they have one), the name they monitor the primary by, and how to talk to that primary
    (database, user, password)."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


@dataclass(frozen=True)
class _Answer:
    """One Sentinel's view of the primary."""

    address: Address
    epoch: int
    flags: frozenset[str]
    failover_timeout_s: float


class PrimaryWatch:
    """The primary that the Sentinels of ``target`` name, followed through failovers, and
    whether they may be failing it over (the module's docstring says why and how).

    ``timeout_s`` bounds each connection to a Sentinel and each question asked of one. It
    also serves as the ``sentinel_manager`` of a redis-py ``SentinelConnectionPool``
    (:meth:`discover_master`), so that every new connection goes where the watch says.
    """

    def __init__(self, target: SentinelTarget, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
        count = len(target.sentinels)
        self.needed = count - count // 2  # ceil(N/2): at least one of every majority
        self._changed = threading.Condition()
        self._address: Address | None = None
        self._settled = False
        self._settled_address: Address | None = None
        self._attempt_at: float | None = None
        self._generation = 0
        self._heard: dict[int, float] = {}
        self._callbacks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._askers = [self._sentinel(host, port) for host, port in target.sentinels]
        self._threads = [
            threading.Thread(target=self._listen, args=(index,), daemon=True,
                             name=f"gln-sentinel-{index}")
            for index in range(count)
        ] + [threading.Thread(target=self._settle_loop, daemon=True, name="gln-sentinels")]
        for thread in self._threads:
            thread.start()

    # -- what the clients ask ----------------------------------------------------------------

    @property
    def address(self) -> Address | None:
        """The address the Sentinels name the primary now (None before it is known)."""
        return self._address

    def discover_master(self, service_name: str) -> Address:
        """Where a new connection goes (redis-py's ``SentinelConnectionPool`` asks)."""
        if self._address is None:
            self._apply(self._generation, self._ask_all())
        if self._address is None:
            raise MasterNotFoundError(f"no Sentinel of {self.target.sentinels} named a "
                                      f"primary for {service_name!r}")
        return self._address

    def discover_slaves(self, service_name: str) -> list[Address]:
        """Replicas are never read from here."""
        return []

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the watch's thread) whenever the named address changes."""
        self._callbacks.append(callback)

    def token(self) -> int | None:
        """Taken before a write: None when the watch is not settled now. The first waits
        (``timeout_s`` at most) for the watch to hear the Sentinels, so that a client made
        a moment ago is not refused for that alone."""
        if self._settled_address is None:
            self.wait_settled(self.timeout_s)
        return self._generation if self._settled else None

    def confirms(self, token: int | None) -> bool:
        """True when the watch has stayed settled, on the same primary and with its
        subscriptions live, since ``token`` was taken: what it writes there stays.

        Two reads of attributes and one of the clock; no round trip."""
        return (token is not None and self._settled and self._generation == token
                and self._live(time.monotonic()) >= self.needed)

    def wait_settled(self, timeout_s: float) -> bool:
        """Wait (``timeout_s`` at most) until the watch is settled; whether it is."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._settled and self._live(time.monotonic()) >= self.needed,
                timeout=timeout_s)

    def why_not(self) -> str:
        """Why :meth:`confirms` would refuse now, in words."""
        live = self._live(time.monotonic())
        if live < self.needed:
            return (f"the service hears {live} of the {len(self.target.sentinels)} Sentinels, "
                    f"and needs {self.needed} to hear every failover")
        if not self._settled:
            return "the Sentinels may be failing the primary over"
        return f"the Sentinels named another primary ({_text(self._address)}) meanwhile"

    def close(self) -> None:
        """Stop the threads and close the connections to the Sentinels."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=2 * self.timeout_s + PING_S)
        for asker in self._askers:
            asker.close()

    # -- listening -----------------------------------------------------------------------------

    def _sentinel(self, host: str, port: int) -> redis.Redis:
        return redis.Redis(host=host, port=port, password=self.target.sentinel_password,
                           socket_connect_timeout=self.timeout_s,
                           socket_timeout=self.timeout_s, decode_responses=True)

    def _live(self, now: float) -> int:
        return sum(now - heard <= LIVE_S for heard in list(self._heard.values()))

    def _listen(self, index: int) -> None:
        """Subscribe to one Sentinel's events and hand them on; reconnect when it goes away."""
        host, port = self.target.sentinels[index]
        while not self._stop.is_set():
            client = self._sentinel(host, port)
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(*_CHANNELS)
                pinged = heard = time.monotonic()
                while not self._stop.is_set():
                    if time.monotonic() - pinged >= PING_S:
                        pubsub.ping()
                        pinged = time.monotonic()
                    message = pubsub.get_message(timeout=PING_S / 2)
                    now = time.monotonic()
                    if message is not None:
                        heard = now
                        self._heard[index] = now
                        if message["type"] == "message":
                            self._event(message["channel"], message["data"])
                    if now - heard > LIVE_S:
                        raise TimeoutError(f"Sentinel {host}:{port} silent for {LIVE_S} s")
            except (redis.RedisError, OSError) as exc:
                if index in self._heard:
                    log.warning("lost the events of Sentinel %s:%d (%s); reconnecting",
                                host, port, exc)
            finally:
                self._lose(index)
                pubsub.close()
                client.close()
            self._stop.wait(PING_S)

    def _lose(self, index: int) -> None:
        """A subscription ended: if too few are left to hear every failover, unsettle."""
        self._heard.pop(index, None)
        if self._live(time.monotonic()) < self.needed:
            self._unsettle(attempt=False)

    def _event(self, channel: str, data: str) -> None:
        words = data.split()
        name = self.target.service_name
        if channel == "+switch-master":  # <name> <old ip> <old port> <new ip> <new port>
            if len(words) == 5 and words[0] == name:
                self._unsettle(attempt=True, address=(words[3], int(words[4])))
            return
        if channel not in _UNNAMED:  # "<type> <name> <ip> <port> [@ <primary> <ip> <port>]"
            at = words.index("@") if "@" in words[:-1] else 0
            if words[at + 1:at + 2] != [name]:
                return
        self._unsettle(attempt=channel in _ATTEMPTS)

    def _unsettle(self, attempt: bool, address: Address | None = None) -> None:
        moved = False
        with self._changed:
            if attempt:
                self._attempt_at = time.monotonic()
            self._settled = False
            self._generation += 1
            if address is not None and address != self._address:
                self._address, moved = address, True
            self._changed.notify_all()
        if moved:
            self._moved()

    def _moved(self) -> None:
        log.info("the Sentinels name %s the primary of %r now", _text(self._address),
                 self.target.service_name)
        for callback in self._callbacks:
            try:
                callback()
            except Exception as exc:  # a closed pool: nothing to drop
                log.debug("dropping connections after a failover failed: %s", exc)

    # -- settling --------------------------------------------------------------------------

    def _settle_loop(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                self._changed.wait_for(lambda: not self._settled or self._stop.is_set())
                generation = self._generation
            if self._stop.is_set():
                return
            self._apply(generation, self._ask_all())
            self._stop.wait(SETTLE_POLL_S)

    def _ask_all(self) -> list[_Answer | None]:
        """Every Sentinel's view (None for one that does not answer), one round trip each."""
        answers: list[_Answer | None] = []
        for asker in self._askers:
            try:
                pipe = asker.pipeline(transaction=False)
                pipe.execute_command("SENTINEL", "MASTER", self.target.service_name)
                pipe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                     self.target.service_name)
                master, named = pipe.execute()
                fields = master if isinstance(master, dict) else dict(  # parsed, or not
                    zip(master[::2], master[1::2], strict=True))
                answers.append(_Answer(
                    (named[0], int(named[1])), int(fields.get("config-epoch", 0)),
                    frozenset(fields.get("flags", "").split(",")),
                    int(fields.get("failover-timeout", 0)) / 1000))
            except (redis.RedisError, OSError, ValueError, TypeError, IndexError):
                answers.append(None)
        return answers

    def _apply(self, generation: int, answers: list[_Answer | None]) -> None:
        """Route to the newest address the Sentinels give; settle where they agree."""
        given = [a for a in answers if a is not None]
        if not given:
            return
        newest = max(a.epoch for a in given)
        at_newest = {a.address for a in given if a.epoch == newest}
        candidate = next(a.address for a in given if a.epoch == newest)
        now = time.monotonic()
        moved = False
        with self._changed:
            if candidate != self._address and len(at_newest) == 1:
                self._address, moved = candidate, True
                self._generation += 1
                generation = self._generation
            timeout_s = max(a.failover_timeout_s for a in given)
            settles = (
                generation == self._generation
                and len(at_newest) == 1
                and sum(a.epoch == newest for a in given) >= self.needed
                and self._live(now) >= self.needed
                and not any(a.flags & _UNSETTLED_FLAGS for a in given)
                and not (candidate == self._settled_address and self._attempt_at is not None
                         and len(given) < len(answers)
                         and now - self._attempt_at < timeout_s)
            )
            if settles and not self._settled:
                self._settled, self._settled_address, self._attempt_at = True, candidate, None
                self._generation += 1
                self._changed.notify_all()
        if moved:
            self._moved()


def _text(address: Address | None) -> str:
    return "nothing" if address is None else f"{address[0]}:{address[1]}"
