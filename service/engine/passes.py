"""The engine's writers: passes that serve the queued requests of many models at once.

Each model keeps its own ordered queue (:class:`~service.engine.served_model.ServedModel`), and
its batches are served one after another, in queue order. What a pass adds is that the batches
of *many* models waiting at the same moment are served together: one hop to a worker thread,
the models served there one after another (each under its own lock), and one loop over their
answers back on the event loop. With one small model per customer and traffic spread over
them, a model seldom has more than one request waiting, so a hop, a wake-up and an answer
loop per model was most of a request's cost; a pass pays them once for all the models it
takes. A log that can defer its syncs (``WriteAheadLog.deferred_sync``) syncs once per pass
too, before any of its answers is sent.

A model is in at most one pass at a time (``scheduled`` from the moment it has work until its
batch is answered), so its batches never overlap and its order holds; a model with more work
after its batch goes to the back of the line, so a busy model does not starve the others.
``lanes`` passes run at once (the model threads), and a pass takes at most
``models_per_pass`` models; the learn batches of members of one family (``families``) are
learned in one library call (``served_model.serve_batches``). Batches of reads alone
(predictions without ids, explanations) run on the read threads, apart from those that write
to the log, as before: a log that hangs never holds every thread the predictions need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from service.engine.served_model import serve_batches
from service.engine.threads import in_thread
from service.errors import Unavailable

if TYPE_CHECKING:
    from service.engine.served_model import ServedModel
    from service.storage.wal import WriteAheadLog

log = logging.getLogger(__name__)

MODELS_PER_PASS = 64  # enough to pay a hop once for a burst; a pass's last answer waits less


class Passes:
    """The passes of one engine: models with queued work line up; ``lanes`` tasks take them
    in turn, up to ``models_per_pass`` at a time, and serve each group in one thread hop."""

    def __init__(
        self, executor: Executor, read_executor: Executor, lanes: int,
        wal: WriteAheadLog | None = None, models_per_pass: int = MODELS_PER_PASS,
    ) -> None:
        self._executor, self._read_executor = executor, read_executor
        self._lanes_wanted = lanes
        self._wal = wal
        self._models_per_pass = models_per_pass
        # The models lined up; a queue wakes one idle lane per model, not every lane.
        self._line: asyncio.Queue[ServedModel] = asyncio.Queue()
        self._lanes: list[asyncio.Task[None]] = []

    def ready(self, served: ServedModel) -> None:
        """(loop) ``served`` has queued work: line it up, unless it is already lined up or in
        a pass (which lines it up again when its batch is answered, if more is waiting)."""
        if served.scheduled:
            return
        served.scheduled = True
        self._line.put_nowait(served)
        if not self._lanes:
            self._lanes = [asyncio.create_task(self._lane(), name=f"gln-pass-{i}")
                           for i in range(self._lanes_wanted)]

    async def close(self) -> None:
        """Stop the lanes (the models have finished their queues first)."""
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)

    async def _lane(self) -> None:
        while True:
            # A pass of its own: nothing of it outlives it here (a deleted model is freed at
            # once, not when this lane next takes work).
            await self._pass(await self._line.get())

    async def _pass(self, first: ServedModel) -> None:
        """Serve the batches of ``first`` and of the models lined up behind it, up to
        ``models_per_pass``: those that only read on the read threads, the others on the
        model threads, at once."""
        reads: list[tuple[ServedModel, list[Any]]] = []
        writes: list[tuple[ServedModel, list[Any]]] = []
        taken = [first]
        while len(taken) < self._models_per_pass and not self._line.empty():
            taken.append(self._line.get_nowait())
        for served in taken:
            if not served.has_queued_work:  # its requests were withdrawn while it waited
                self._done_with(served)
                continue
            batch = served.take_batch()
            (reads if served.reads_only(batch) else writes).append((served, batch))
        await asyncio.gather(*(self._serve(executor, part) for executor, part in (
            (self._read_executor, reads), (self._executor, writes)) if part))

    async def _serve(self, executor: Executor, batches: list[tuple[ServedModel, list[Any]]]
                     ) -> None:
        """Serve ``batches`` in one hop to ``executor``, then answer them and line up again
        the models that have more work."""
        try:
            outcomes = await in_thread(executor, self._serve_all, batches)
        except Exception as exc:  # e.g. the thread pool is gone: nobody may hang
            outcomes = [served.failed_batch(batch, exc) for served, batch in batches]
        for (served, _), groups in zip(batches, outcomes, strict=True):
            served.deliver(groups)
            self._done_with(served)

    def _done_with(self, served: ServedModel) -> None:
        """(loop) ``served``'s batch is answered: line it up again if more work waits."""
        served.scheduled = False
        if served.has_queued_work:
            self.ready(served)
        else:
            served.idle.set()

    def _serve_all(self, batches: list[tuple[ServedModel, list[Any]]]) -> list[Any]:
        """(thread) Each model's batch in turn; one sync of the log for all, before any answer."""
        with self._synced_once(batches):
            return serve_batches(batches)

    @contextlib.contextmanager
    def _synced_once(self, batches: list[tuple[ServedModel, list[Any]]]) -> Iterator[None]:
        """The log's appends of the block synced once as it ends, where the log can defer
        them. If that fails, no request of the pass is acknowledged, and each model is in
        doubt: it catches up with what the log holds before it learns again (and is rebuilt
        from its snapshot if the log lacks what it learned)."""
        deferred: Callable[[], Any] | None = getattr(self._wal, "deferred_sync", None)
        if deferred is None:
            yield
            return
        try:
            with deferred():
                yield
        except Exception as exc:
            for served, _ in batches:
                served.put_in_doubt()
            raise Unavailable(f"write-ahead log did not confirm the appends ({type(exc).__name__}"
                              "; see the service log): the requests are not acknowledged: "
                              "retry them with the same Idempotency-Key") from exc
