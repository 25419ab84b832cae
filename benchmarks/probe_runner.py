"""The parent side of `benchmarks.probe`: run one probe in a fresh child process and read its JSON line.

Separate from the child's module so that the harness's sections (e.g. `benchmarks.engines`) can start probes while
the child imports their workloads, without the two modules importing each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import REPO


def run_probe(spec: dict[str, object], timeout: float = 1800) -> dict[str, object]:
    """Run one probe in a child process (same interpreter, repository root on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "benchmarks.probe", json.dumps(spec)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"probe {spec} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])
