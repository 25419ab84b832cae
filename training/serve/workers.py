"""Worker processes (``--workers`` > 1, docs/serving.md, "Workers"): `ProcessTranslator` runs a worker's searches in
a child process with its own instance of the model (`_worker_process`), so that two searches do not take turns on
Python's lock as two threads of one process would."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .engines import load_translator
from .translators import More, Settings, Source, first_line

class ProcessTranslator:
    """A worker whose searches run in a child process with its own instance of the model (``--workers`` > 1,
    docs/serving.md, "Workers"): the server's first worker tokenizes and searches in the server process, each further
    one searches here. Two searches on threads of one process take turns on Python's lock between operators; in two
    processes they do not (measured: two one-worker servers on this 2-core CPU answered 68.5 sentences/s at 32 clients
    together, one server with two worker threads 49.9).

    ``translate`` sends the batch's tokenized sources and settings to the child and returns its translations; the
    child hands back each sentence's translations as soon as its search is over (``deliver``), as a thread worker
    does. A failure inside the batch comes back as the exception itself (its batch's requests get it, the worker goes
    on); a child that died fails its batch and every later one sent to it. The child ignores SIGINT/SIGTERM: the
    server process decides when it stops (`close`, after the batches in flight), and a child whose server is gone
    ends at once (its pipe closes)."""

    def __init__(self, engine: str, folder: str | os.PathLike, threads: int, max_input_tokens: int | None,
                 search: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.engine = engine
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_process, name="deepnmt-serve-worker", daemon=True,
                                       args=(child, engine, str(folder), threads, max_input_tokens, search))
        self.process.start()
        child.close()
        message = self._receive()
        if message[0] != "ready":
            self.close()
            raise RuntimeError(f"a worker process could not load the model: {message[1]}")
        self.max_input_tokens = message[1]
        self.lock = threading.Lock()

    def _receive(self) -> tuple:
        try:
            return self.connection.recv()
        except (EOFError, OSError) as error:
            raise RuntimeError(f"the worker process (pid {self.process.pid}) ended (exit code "
                               f"{self.process.exitcode}); restart the server") from error

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        with self.lock:  # one search at a time per worker (`ServerState.idle` already ensures it)
            try:
                self.connection.send(("translate", list(sources), settings))
            except (OSError, ValueError) as error:
                raise RuntimeError(f"the worker process (pid {self.process.pid}) cannot take a batch: "
                                   f"{first_line(error)}") from error
            while True:
                message = self._receive()
                if message[0] == "deliver":
                    if deliver is not None:
                        deliver(message[1], message[2])
                elif message[0] == "done":
                    return message[1]
                else:  # ("error", exception)
                    raise message[1]

    def close(self) -> None:
        """Ask the child to end and wait for it (it has no batch by then: the batcher stopped first)."""
        with contextlib.suppress(OSError, ValueError):
            self.connection.send(("stop",))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


def _worker_process(connection: Any, engine: str, folder: str, threads: int, max_input_tokens: int | None,
                    search: str) -> None:
    """The child of a `ProcessTranslator`: load the engine, then translate each batch it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM reach the server, which drains first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        translator = load_translator(engine, folder, threads, max_input_tokens, search)
    except Exception as error:  # noqa: BLE001  (the server reports it and does not start)
        connection.send(("failed", first_line(error)))
        return
    connection.send(("ready", translator.max_input_tokens))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return  # the server is gone
        if message[0] == "stop":
            return
        _, sources, settings = message
        try:
            outputs = translator.translate(sources, settings,
                                           lambda index, candidates: connection.send(("deliver", index, candidates)))
        except Exception as error:  # noqa: BLE001  (the batch's requests get it; the worker goes on)
            try:
                connection.send(("error", error))
            except Exception:  # noqa: BLE001  (an exception that does not pickle)
                connection.send(("error", RuntimeError(f"{type(error).__name__}: {first_line(error)}")))
        else:
            connection.send(("done", outputs))

