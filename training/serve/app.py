"""Running the server (`serve`, what `deepnmt serve` calls): plan its models, bind the port, build each model's
`ServerState` and the application, and run uvicorn until SIGINT/SIGTERM, after which every request in flight is
answered and the process exits with status 0 (`exit_quietly_on_signals`). uvicorn and torch are imported here when
the server starts."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from ..errors import CommandLineError
from .libretranslate import ApiKeys, read_api_keys
from .metrics import MetricFamilies
from .options import EXPORT_EXTRA_HINT, ServeOptions, default_workers, describe_pairs, plan_models
from .routes import build_app
from .service import ServerState, Service
from .translators import Translator

logger = logging.getLogger("deepnmt.serve")


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port`` (port 0: a free one), or one `CommandLineError` sentence."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # connections queue from now on, before uvicorn's loop accepts them
    except OSError as error:
        raise CommandLineError(f"cannot listen on {host}:{port} ({error.strerror or error}); choose another "
                               "--host/--port (--port 0 takes a free port).") from None
    sock.set_inheritable(True)
    return sock


def configure_logging() -> None:
    """One line per event of this server on stderr: ``[deepnmt serve] ...``."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s [deepnmt serve] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


@contextlib.contextmanager
def exit_quietly_on_signals() -> Iterator[None]:
    """uvicorn handles SIGINT/SIGTERM itself (graceful shutdown), then re-raises the signal to the handler it found:
    with no-op handlers in place, the process then ends normally, with status 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)



def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine only."""
    import ipaddress

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def serve(options: ServeOptions, loader: Callable[[], Translator] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; 0 after a graceful shutdown. A model that cannot load stops it: its
    error is raised (one sentence for a user's mistake, through the command line)."""
    import uvicorn

    cuda = False
    if options.engine in (None, "torch"):
        import torch  # the default engine depends on a GPU; torch loads with the model anyway

        cuda = torch.cuda.is_available()
    models = plan_models([options.model, *options.more_models], options.engine, cuda)
    for model in models:
        needed = {"onnx": "onnxruntime", "ctranslate2": "ctranslate2"}.get(model.engine)
        if needed and importlib.util.find_spec(needed) is None:
            raise CommandLineError(f"the {model.engine} engine needs {needed}, which the export extra installs: "
                                   f"{EXPORT_EXTRA_HINT}.")
    keys = ApiKeys(read_api_keys(options.api_keys)) if options.api_keys else None
    configure_logging()
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    families = MetricFamilies()
    states = []
    for model in models:
        own = replace(options, model=model.given, more_models=(),
                      workers=options.workers or default_workers(model.engine, cuda, options.threads))
        states.append(ServerState(own, model.engine, model.folder, loader, pair=model.pair, families=families))
    service = Service(states, keys, families)
    config = uvicorn.Config(build_app(service), lifespan="on", access_log=False, log_level="info",
                            timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)

    def stop_on_load_error() -> None:
        server.should_exit = True

    for state in states:
        state.on_load_error = stop_on_load_error
    shown = f"[{host}]" if ":" in host else host
    if len(states) > 1:
        logger.info("serving %d models: %s", len(states),
                    ", ".join(f"{describe_pairs([state.pair])} from {state.folder}" for state in states if state.pair))
    if keys is None and not is_loopback(options.host):
        logger.warning("no --api_keys: anyone who can reach %s:%d may translate (the server is open beyond this "
                       "machine)", shown, port)
    elif keys is not None:
        logger.info("API keys: %d accepted (from --api_keys), %d with a requests-per-minute limit",
                    len(keys.limits), sum(limit is not None for limit in keys.limits.values()))
    logger.info("listening on http://%s:%d (POST / or /predict, POST /translate, POST /detect, GET /languages, "
                "GET /health, GET /metrics)", shown, port)
    with exit_quietly_on_signals():
        server.run(sockets=[sock])
    for state in states:
        if state.load_error is not None:
            raise state.load_error
    logger.info("stopped: %d requests answered", int(families.value("deepnmt_requests_total")))
    return 0

