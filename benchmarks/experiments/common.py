"""What the miniature experiments share: reading a run's Trainer log, plotting several runs' curves side by side,
naming the recipe their runs used, and rewriting the generated blocks of a hand-written report."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# The `miniature` recipe is the `quickstart` recipe of before this time (2026-11-23 15:49 UTC, commit defecf9), renamed
# unchanged; a run started before it ran `--recipe quickstart`. Run folders end in their start time (Unix seconds).
MINIATURE_RENAMED_AT = 1795448949


def add_output_arguments(parser: argparse.ArgumentParser, work_dir: str) -> None:
    """``--work_dir`` (the runs), ``--results`` (the committed JSON/markdown) and ``--render_only``."""
    parser.add_argument("--work_dir", default=work_dir)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--render_only", action="store_true", help="Rewrite the markdown from the results' JSON.")


def render_only(args: argparse.Namespace, name: str, render: Callable[[dict, Path], None]) -> bool:
    """With ``--render_only``: re-render ``<results>/<name>.json`` and say so (the caller stops)."""
    if not args.render_only:
        return False
    results_dir = Path(args.results)
    render(json.loads((results_dir / f"{name}.json").read_text()), results_dir)
    return True


def miniature_recipe(folders: Iterable[str]) -> str:
    """How a report names the recipe that the runs in ``folders`` trained with: `miniature`, and when every one of
    them started before the rename (the start time that ends each folder's name), the name their commands used."""
    started = [Path(folder).name.rsplit("-", 1)[-1] for folder in folders]
    if started and all(start.isdigit() and int(start) < MINIATURE_RENAMED_AT for start in started):
        return "`miniature` (run as `--recipe quickstart`, the same file's name until 2026-11-23)"
    return "`miniature`"


def merge_generated(text: str, blocks: Sequence[tuple[str, str]]) -> str:
    """``text`` with the body of every ``<!-- generated:NAME -->`` … ``<!-- /generated:NAME -->`` block of ``blocks``
    (``(NAME, body)``) replaced; a block the text has no markers for is an error, and everything outside the markers
    (the hand-written narrative) stays as it was. The same convention as benchmarks/RESULTS.md."""
    for name, body in blocks:
        start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"the report has no {start} … {end} block")
        text = pattern.sub(lambda _: f"{start}\n{body}\n{end}", text, count=1)
    return text


def history(folder: Path) -> list[dict]:
    """The Trainer's ``log_history`` of a finished run folder."""
    return json.loads((folder / "trainer_state.json").read_text())["log_history"]


def series(log: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every log entry that has a numeric ``key``."""
    return [(entry["step"], entry[key]) for entry in log if key in entry and isinstance(entry[key], (int, float))]


def plot_runs(
    runs: Mapping[str, Mapping[str, list]],
    panels: Sequence[tuple[str, str]],
    path: Path,
    title: str,
    markers: Sequence[str] = (),
    log_scale: Sequence[str] = (),
) -> None:
    """One panel per ``(key, title)`` with one curve per run (``runs``: label → {key: [(step, value), …]}); keys in
    ``markers`` get point markers (sparse evaluations), keys in ``log_scale`` a log y-axis. Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for axis, (key, panel_title) in zip(axes[0], panels):
        for label, run in runs.items():
            points = run.get(key, [])
            if points:
                axis.plot(*zip(*points), label=label, marker="o" if key in markers else None)
        axis.set_title(panel_title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if key in log_scale:
            axis.set_yscale("log")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
