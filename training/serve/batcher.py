"""Dynamic batching: `Batcher` forms batches of the waiting sentences (`queues`) and runs each batch's search on a
worker thread, at most ``--workers`` at once. Its policy is one method, `Batcher.choose` (which queue goes next, and
when), with `take` (which of its sentences) and `admit` (which sentences join a running search); the queues'
mechanics are in `queues`, the searches run here (`run`, `search`) and their sentences go back to their requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .metrics import Metrics
from .queues import Batch, Item, Job, SentenceQueues, closest_lengths, oldest_requests
from .translators import More, Settings, Source

logger = logging.getLogger("deepnmt.serve")


class Batcher:
    """Dynamic batching (`hf_deepnmt_training.serve`'s docstring): a queue per generation-parameter key and new-token
    budget, one search at a time on each worker thread (the model is not run on the event loop, so the server answers
    /health and /metrics and takes requests while it translates). While a retiring search runs, sentences of its
    parameters join it between decoder steps as rows free up (`admit`, continuous batching). The queues are shared by
    the event loop and the workers (`SentenceQueues.lock`)."""

    def __init__(self, translate: Callable[[Sequence[Source], Settings, Callable[[int, list[str]], None], More],
                                           list[list[str]]], metrics: Metrics,
                 max_batch_size: int = 32, max_wait_ms: float = 10.0, max_queue: int = 256,
                 executor: ThreadPoolExecutor | None = None, workers: int = 1,
                 full_batch_to_overlap: bool = True) -> None:
        self.translate = translate
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.queues = SentenceQueues(max_queue)
        self.workers = workers  # searches at once, each on its own thread (and model instance: `ServerState`)
        self.searching = 0  # searches running now
        # while a search runs, only a full batch starts another (workers on threads of one process); worker
        # processes overlap any two searches (docs/serving.md, "Workers")
        self.full_batch_to_overlap = full_batch_to_overlap
        self.executor = executor or ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deepnmt-translate")
        self.batch_number = 0
        self.wakeup = asyncio.Event()
        self.stopping = False
        self.task: asyncio.Task | None = None

    @property
    def max_queue(self) -> int:
        return self.queues.max_queue

    @property
    def waiting(self) -> int:
        """Sentences waiting for a batch."""
        return self.queues.waiting

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name="deepnmt-batcher")

    async def stop(self) -> None:
        """Let the batches of every sentence still waiting run, then end the loop (uvicorn calls the lifespan's end
        after the last request was answered, so nothing waits by then)."""
        self.stopping = True
        self.wakeup.set()
        if self.task is not None:
            await self.task
        self.executor.shutdown(wait=True)

    def submit(self, settings: Settings, sources: Sequence[tuple[int, Source]], texts: int) -> Job:
        """Queue a request's sources (``(index among its texts, source)``); raises `QueueFull`."""
        job = self.queues.add(settings, sources, texts)
        self.wakeup.set()
        return job

    def withdraw(self, job: Job) -> int:
        """Take a job's waiting sentences out of the queue (its client left, or another of its batches failed);
        returns how many. Its sentences already in the running batch are translated and dropped."""
        removed = self.queues.withdraw(job)
        if removed:
            self.wakeup.set()
        return removed

    # -------------------------------------------------------------------------------------------- the policy
    def choose(self) -> list[Item] | float:
        """The scheduling policy, under the queues' lock with sentences waiting: the batch to start now, or how many
        seconds to wait before choosing again (a new request or a search's end wakes the batcher sooner).

        1. The oldest waiting sentence's queue (`Item.queue`: its request's generation parameters, and its new-token
           budget unless one search decodes every budget) goes once it holds ``max_batch_size`` sentences, or the
           oldest has waited ``max_wait_ms``, or the server is stopping. With ``full_batch_to_overlap`` (workers on
           threads of one process), while another search runs only a full batch starts one: two searches on threads
           pay only when each is large (docs/serving.md, "Workers"); a smaller batch waits for the running search to
           end, as with one worker.
        2. Before that, another queue's full batch goes: it is ready, and it delays the oldest by one batch at most,
           since the oldest goes first once its wait is over.
        3. Which of the queue's sentences make the batch: `take`.
        """
        oldest = self.queues.oldest()
        queue = self.queues.pending[oldest.queue]
        wait = oldest.arrived + self.max_wait_s - time.monotonic()
        overdue = wait <= 0 and not (self.searching and self.full_batch_to_overlap)
        if len(queue) >= self.max_batch_size or self.stopping or overdue:  # 1.
            return self.take(oldest, queue)
        full = self.queues.full(self.max_batch_size)  # 2.
        if full is not None:
            return self.take(full[0], full)
        return wait

    def take(self, oldest: Item, queue: list[Item]) -> list[Item]:
        """Remove and return the batch, sorted by length: every waiting sentence of the key if they fit; else, for a
        queue of every budget (one retiring search), the oldest requests' sentences in arrival order, whole requests
        only (a request's texts in one batch, unless one request alone has more than a batch takes); else (one
        ``generate`` call per batch) the ``max_batch_size`` consecutive ones in length order that include ``oldest``
        with the smallest length spread (and no sentence waits behind newer ones forever)."""
        size = self.max_batch_size
        if len(queue) > size and oldest.job.settings.mixes_budgets:  # one retiring search: first come, first served
            queue_part = oldest_requests(queue, size)
        else:
            queue_part = queue
        batch = closest_lengths(queue_part, oldest, size)  # one generate call: the closest lengths
        self.queues.remove(oldest.queue, queue, batch)
        return batch

    def admit(self, key: tuple[str, int | None], searched: int) -> list[Item]:
        """Worker thread, between two decoder steps of a search of ``key``'s parameters holding ``searched``
        sentences: the waiting sentences of ``key`` that join it now — the oldest requests' (whole requests, as
        `take`), as many as leave the search at most ``max_batch_size`` — or none while a sentence of other
        parameters has waited its ``max_wait_ms`` (the search then ends and that batch goes next)."""
        free = self.max_batch_size - searched
        with self.queues.lock:
            queue = self.queues.pending.get(key)
            if free <= 0 or not queue or self.queues.overdue_besides(key, self.max_wait_s):
                return []
            chosen = oldest_requests(queue, free)
            self.queues.remove(key, queue, chosen)
        return chosen

    # -------------------------------------------------------------------------------------------- running searches
    async def next_batch(self) -> list[Item] | None:
        """Wait for the next batch (`choose`); ``None`` when stopping with nothing left."""
        while True:
            if not self.queues.pending:
                if self.stopping:
                    return None
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            with self.queues.lock:  # a running search's worker may take joining sentences (`admit`) meanwhile
                chosen = self.choose()
            if isinstance(chosen, list):
                return chosen
            self.wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # a search's end wakes it too (`run`)
                await asyncio.wait_for(self.wakeup.wait(), chosen if chosen > 0 else None)

    async def run(self) -> None:
        """Form batches and start their searches, at most ``workers`` at once (a batch is formed when a worker is
        free, so that it takes whatever waits then); after the last batch, wait for the searches still running."""
        free = asyncio.Semaphore(self.workers)
        running: set[asyncio.Task] = set()
        while True:
            await free.acquire()
            first = await self.next_batch()
            if first is None:
                break
            first = [item for item in first if not item.job.future.done()]  # a failed or abandoned request's rest
            if not first:
                free.release()
                continue
            task = asyncio.get_running_loop().create_task(self.search(first))
            running.add(task)
            self.searching += 1

            def ended(done: asyncio.Task) -> None:
                running.discard(done)
                self.searching -= 1
                free.release()
                self.wakeup.set()  # a batch held back while this search ran may go now

            task.add_done_callback(ended)
        if running:
            await asyncio.wait(running)

    async def search(self, first: list[Item]) -> None:
        """One search of a batch on a worker thread: its sentences go back to their requests as each is done;
        with continuous batching, sentences of its parameters join it between decoder steps."""
        loop = asyncio.get_running_loop()
        settings = first[0].job.settings
        items = list(first)  # every sentence of this search, in the order the engine numbers them
        self.open_batch(first, 0)

        def deliver_early(position: int, candidates: list[str]) -> None:
            # worker thread: the sentence's search is over while its batch goes on; its request may be answered
            loop.call_soon_threadsafe(self.deliver, items[position], candidates)

        def more(searched: int) -> list[Source]:
            # worker thread, between decoder steps: sentences of the same parameters join the running search
            joining = self.admit(first[0].queue, searched)
            items.extend(joining)
            loop.call_soon_threadsafe(self.stepped, joining, searched)
            return [item.source for item in joining]

        try:
            outputs = await loop.run_in_executor(self.executor, self.translate, [item.source for item in first],
                                                 settings, deliver_early, more)
            if len(outputs) != len(items):
                raise RuntimeError(f"the engine gave {len(outputs)} results for a batch of {len(items)} sentences")
        except Exception as error:  # noqa: BLE001  (the search's requests get it; the server goes on)
            logger.error("the search of batch %d failed", first[0].batch.number, exc_info=error)
            self.fail(items, error)
        else:
            for item, candidates in zip(items, outputs):
                self.deliver(item, candidates)

    def open_batch(self, items: Sequence[Item], searched: int) -> None:
        """Count and log a batch: ``items`` start a search (``searched`` 0) or join one of ``searched`` sentences."""
        self.batch_number += 1
        lengths = [item.source.length for item in items]
        batch = Batch(self.batch_number, len(items), len({id(item.job) for item in items}),
                      (min(lengths), max(lengths)), searched, time.perf_counter(), remaining=len(items))
        for item in items:
            item.batch = batch
        self.metrics.batch_opened(len(items))

    def stepped(self, joining: Sequence[Item], searched: int) -> None:
        """Event loop: a decoder step of a continuous search is next, with ``joining`` sentences added to the
        ``searched`` ones."""
        if joining:
            self.open_batch(joining, searched)
        self.metrics.search_stepped(searched + len(joining))

    def deliver(self, item: Item, candidates: list[str]) -> None:
        """Hand a sentence's translations to its request, once (early from the search, or at its batch's end); a
        batch whose last sentence this is gets its log line."""
        if item.delivered:
            return
        item.delivered = True
        if not item.job.future.done():
            item.job.deliver(item.index, candidates)
        self._count_delivered(item, failed=False)

    def _count_delivered(self, item: Item, failed: bool) -> None:
        batch = item.batch
        if batch is None:
            return
        batch.remaining -= 1
        if batch.remaining:
            return
        seconds = time.perf_counter() - batch.started
        self.metrics.batch_ended(batch.sentences, failed, seconds)
        joined = f"joined a search of {batch.searched} sentences and " if batch.searched else ""
        logger.info("batch %d: %d sentences from %d requests, %d-%d source tokens, parameters %s: %s%s in %.3f s, "
                    "%d sentences waiting", batch.number, batch.sentences, batch.requests, *batch.lengths,
                    item.job.settings.key, joined, "FAILED" if failed else "translated", seconds, self.waiting)

    def fail(self, items: Sequence[Item], error: Exception) -> None:
        """Every request with a sentence in ``items`` (a failed search) gets ``error``; their other waiting
        sentences leave the queue."""
        for job in {id(item.job): item.job for item in items}.values():
            if not job.future.done():
                job.future.set_exception(error)
            self.withdraw(job)
        for item in items:
            if not item.delivered:
                item.delivered = True
                self._count_delivered(item, failed=True)

