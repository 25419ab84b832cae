"""One clock per training command, so that the run time a model card states is the one the command prints.

`deepnmt train` and `deepnmt quickstart` start a `RunClock` as the command starts (before their heavy imports); the
run stops it once the model folder is complete (`hf_deepnmt_training.report.finish_run`, again at the end of the quickstart's
sample translations) and writes the stopped figure into the card and ``metrics.json``; the command prints the same
stopped figure (``deepnmt train finished in X min``). A run started without the command line (a direct
`hf_deepnmt_training.train.train` call) starts its own clock. Only the standard library is imported here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RunClock:
    """When a command started, and the run time it reports once stopped."""

    command: str = "train"
    started: float = field(default_factory=lambda: time.time())
    seconds: float | None = None

    def stop(self) -> float:
        """Stop the clock now (a later call stops it again, later): the seconds since the start, to 0.1 s."""
        self.seconds = round(time.time() - self.started, 1)
        return self.seconds

    def minutes(self) -> str:
        """The run time as the card and the command state it, e.g. ``"8.5 min"``: the stopped figure (the time so
        far while the clock runs)."""
        seconds = self.seconds if self.seconds is not None else time.time() - self.started
        return f"{seconds / 60:.1f} min"
