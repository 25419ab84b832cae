"""The sentences waiting for a batch, and the mechanics of taking them out (`Batcher` decides which go together):
each request's `Job`, each sentence's `Item`, and `SentenceQueues`, a queue per `Item.queue` in arrival order. The
queues are shared by the event loop (requests join, and leave when their client goes) and a search's worker thread
(sentences join a running search): ``SentenceQueues.lock`` guards them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .options import RETRY_AFTER_S
from .translators import Settings, Source


class QueueFull(Exception):
    """The queue cannot take a request's sentences now: 503 with Retry-After."""


@dataclass(eq=False)
class Job:
    """One request's sentences on their way through the queue; ``future`` gets every text's translations."""

    settings: Settings
    future: asyncio.Future
    results: list[list[str] | None]
    remaining: int

    def deliver(self, index: int, candidates: list[str]) -> None:
        self.results[index] = candidates
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.results)


@dataclass(eq=False)
class Batch:
    """Sentences taken from the queue together: a new search, or sentences joining a running one."""

    number: int
    sentences: int
    requests: int
    lengths: tuple[int, int]  # shortest and longest source, in tokens
    searched: int  # sentences already in the search it joined (0: it started the search)
    started: float  # time.perf_counter()
    remaining: int = 0  # sentences not yet delivered


@dataclass(eq=False)
class Item:
    """One sentence waiting for a batch."""

    job: Job
    index: int  # its place among the request's texts
    source: Source
    sequence: int  # arrival order
    arrived: float  # time.monotonic()
    delivered: bool = False  # its translations went to its request (early, or at the end of its batch)
    batch: Batch | None = None

    @property
    def queue(self) -> tuple[str, int | None]:
        """Its queue: the request's generation parameters and, unless the engine decodes several budgets in one
        search (`Settings.mixes_budgets`), the sentence's new-token budget (a batch of several budgets would
        otherwise be several calls)."""
        settings = self.job.settings
        return settings.key, None if settings.mixes_budgets else self.source.budget



class SentenceQueues:
    """Every waiting sentence: ``pending`` maps an `Item.queue` to its sentences in arrival order, ``waiting`` counts
    them (at most ``max_queue``, ``--max_queue``)."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.pending: dict[tuple[str, int | None], list[Item]] = {}  # `Item.queue` -> its sentences, in arrival order
        self.waiting = 0  # sentences in `pending`
        self.sequence = 0
        self.lock = threading.Lock()  # `pending` and `waiting`: the worker takes joining sentences from them

    def add(self, settings: Settings, sources: Sequence[tuple[int, Source]], texts: int) -> Job:
        """Queue a request's sources (``(index among its texts, source)``); raises `QueueFull`."""
        with self.lock:
            if self.waiting + len(sources) > self.max_queue:
                raise QueueFull(f"the queue holds {self.waiting} sentences and takes at most {self.max_queue} "
                                f"(--max_queue); retry in {RETRY_AFTER_S} s.")
            future = asyncio.get_running_loop().create_future()
            job = Job(settings, future, [None] * texts, len(sources))
            now = time.monotonic()
            for index, source in sources:
                self.sequence += 1
                item = Item(job, index, source, self.sequence, now)
                self.pending.setdefault(item.queue, []).append(item)
            self.waiting += len(sources)
        return job

    def withdraw(self, job: Job) -> int:
        """Take a job's waiting sentences out of the queues; returns how many."""
        removed = 0
        with self.lock:
            for key, queue in list(self.pending.items()):
                kept = [item for item in queue if item.job is not job]
                if len(kept) < len(queue):
                    removed += len(queue) - len(kept)
                    if kept:
                        self.pending[key] = kept
                    else:
                        del self.pending[key]
            self.waiting -= removed
        return removed

    def remove(self, key: tuple[str, int | None], queue: list[Item], chosen: Sequence[Item]) -> None:
        """Take ``chosen`` out of ``key``'s ``queue`` (under ``lock``)."""
        taken = set(map(id, chosen))
        kept = [item for item in queue if id(item) not in taken]
        if kept:
            self.pending[key] = kept
        else:
            del self.pending[key]
        self.waiting -= len(chosen)

    def oldest(self) -> Item:
        """The sentence that has waited longest (under ``lock``, with sentences waiting)."""
        return min((queue[0] for queue in self.pending.values()), key=lambda item: item.sequence)

    def full(self, size: int) -> list[Item] | None:
        """A queue holding ``size`` sentences or more (under ``lock``), if any."""
        return next((queue for queue in self.pending.values() if len(queue) >= size), None)

    def overdue_besides(self, key: tuple[str, int | None], max_wait_s: float) -> bool:
        """Whether a sentence of another queue than ``key``'s has waited ``max_wait_s`` (under ``lock``)."""
        now = time.monotonic()
        return any(other[0].arrived + max_wait_s <= now for other_key, other in self.pending.items()
                   if other_key != key)


def oldest_requests(queue: list[Item], size: int) -> list[Item]:
    """The first ``size`` sentences of ``queue`` in arrival order, cut before the first request that does not fit
    whole (a request's waiting sentences are consecutive in arrival order: one `SentenceQueues.add`)."""
    by_arrival = sorted(queue, key=lambda item: item.sequence)
    chosen = by_arrival[:size]
    if len(by_arrival) > size and by_arrival[size].job is chosen[-1].job:  # the cut splits the last request
        split = chosen[-1].job
        whole = [item for item in chosen if item.job is not split]
        chosen = whole or chosen  # one request larger than a batch: its first sentences
    return chosen


def closest_lengths(items: list[Item], oldest: Item, size: int) -> list[Item]:
    """``items`` sorted by length; when more than ``size``, the ``size`` consecutive ones in length order that include
    ``oldest`` with the smallest length spread (length-sorted batches pad least)."""
    by_length = sorted(items, key=lambda item: (item.source.length, item.sequence))
    if len(by_length) > size:
        position = by_length.index(oldest)
        starts = range(max(0, position - size + 1), min(position, len(by_length) - size) + 1)
        start = min(starts, key=lambda s: (by_length[s + size - 1].source.length - by_length[s].source.length, s))
        by_length = by_length[start:start + size]
    return by_length
