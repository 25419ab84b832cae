"""`deepnmt serve` with slowness and a fault put in, for tests/test_serve.py (run as a script, a real server process).

    python tests/serve_fault_worker.py LOAD_DELAY_S BATCH_DELAY_S SERVE_ARGS...

The model loads ``LOAD_DELAY_S`` seconds late (so /health can be seen answering 503), every batch takes
``BATCH_DELAY_S`` seconds longer (so requests are in flight, the queue fills, a client can leave while its request
waits), and a batch whose requests ask for ``max_new_tokens`` = `FAULT_MAX_NEW_TOKENS` raises `RuntimeError` inside the
worker thread, where a broken model would. Everything else is the unchanged `hf_deepnmt_training.serve`.
"""

from __future__ import annotations

import sys
import time

import hf_deepnmt_training.serve as serve
from hf_deepnmt_training.cli import main

FAULT_MAX_NEW_TOKENS = 13  # tests/test_serve.py asks for this value to make its batch fail


def with_faults(load_delay_s: float, batch_delay_s: float) -> None:
    load_translator = serve.engines.load_translator

    def slow_load(*args, **kwargs):
        time.sleep(load_delay_s)
        translator = load_translator(*args, **kwargs)
        translate = translator.translate

        def slow_translate(sources, settings, deliver=None, more=None):
            time.sleep(batch_delay_s)
            if settings.parameters.get("max_new_tokens") == FAULT_MAX_NEW_TOKENS:
                raise RuntimeError("injected fault")
            return translate(sources, settings, deliver, more)

        translator.translate = slow_translate
        return translator

    serve.engines.load_translator = slow_load  # the server's loader looks it up there when the model loads


if __name__ == "__main__":
    with_faults(float(sys.argv[1]), float(sys.argv[2]))
    sys.exit(main(["serve", *sys.argv[3:]]))
