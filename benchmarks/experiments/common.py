"""What the miniature experiments share: their command line's common options, reading a run's Trainer log, plotting
several runs' curves side by side, naming the recipe their runs used, and rewriting the generated blocks of a
hand-written report."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# The `miniature` recipe is the `quickstart` recipe of before this time (2026-11-23 15:49 UTC, commit defecf9), renamed
# unchanged; a run started before it ran `--recipe quickstart`. Run folders end in their start time (Unix seconds).
MINIATURE_RENAMED_AT = 1795448949


# The help of each option of `experiment_parser` that a script does not describe itself (``helps``).
OPTION_HELP = {
    "rows": "Comma-separated rows to run.",
    "seeds": "Comma-separated seeds; every row runs with each.",
    "max_steps": "Training steps of every run.",
    "max_tokens": "Tokens per training batch.",
    "learning_rate": "Peak learning rate.",
    "warmup_steps": "Warm-up steps of the learning-rate schedule.",
    "eval_steps": "Evaluate on the validation pairs every this many steps.",
    "eval_samples": "Validation pairs of each evaluation.",
    "test_samples": "Test pairs (the first of the test file) translated and scored at the end of each run.",
    "device": "Where the runs train: the device changes only their speed.",
    "parallel": "Runs at a time.",
    "threads": "CPU threads (OMP_NUM_THREADS) of each run.",
    "work_dir": "Folder the runs write into.",
    "results": "Folder of the results' JSON, markdown and plots (default: results/ beside the experiments).",
}
# The type of each numeric option of `experiment_parser` (the others are strings).
OPTION_TYPE: dict[str, type] = {"max_steps": int, "max_tokens": int, "learning_rate": float, "warmup_steps": int,
                                "eval_steps": int, "eval_samples": int, "test_samples": int, "parallel": int,
                                "threads": int}


def experiment_parser(
    doc: str,
    *,
    work_dir: str,
    threads: int,
    plots: bool = False,
    rows: str | None = None,
    row_names: Collection[str] = (),
    seeds: str | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    learning_rate: float | None = None,
    warmup_steps: int | None = None,
    eval_steps: int | None = None,
    eval_samples: int | None = None,
    test_samples: int | None = None,
    device: bool = False,
    parallel: int | None = None,
    helps: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """The command line every experiment starts from, which the script extends with its own options: the options
    that several experiments have with the same name, type and meaning, each defined once here.

    ``doc`` is the script's docstring; its first paragraph is the description. Every experiment gets ``--work_dir``
    (default ``work_dir``), ``--results`` (default `RESULTS`), ``--render_only`` (measure nothing: rewrite the
    markdown, and with ``plots`` the plot too, from the results' JSON) and ``--threads`` (default ``threads``). Every
    other keyword adds its option with that value as the default, and left at ``None`` (``device``: ``False``) leaves
    the option out, so that each script's command line has exactly the options it uses: ``--rows`` and ``--seeds``
    (comma-separated strings), ``--max_steps``, ``--max_tokens``, ``--learning_rate``, ``--warmup_steps``,
    ``--eval_steps``, ``--eval_samples``, ``--test_samples``, ``--parallel``, and ``--device`` (``cpu`` or ``cuda``,
    default ``cpu``). ``row_names`` are the rows ``--rows`` chooses from (its help; `chosen_rows` checks a value
    against them). ``helps`` replaces the help (`OPTION_HELP`) of the options it names (without the dashes) where a
    script says more; naming an option the parser does not have is an error."""
    defaults: dict[str, object | None] = {
        "rows": rows, "seeds": seeds, "max_steps": max_steps, "max_tokens": max_tokens,
        "learning_rate": learning_rate, "warmup_steps": warmup_steps, "eval_steps": eval_steps,
        "eval_samples": eval_samples, "test_samples": test_samples, "device": "cpu" if device else None,
        "parallel": parallel, "threads": threads, "work_dir": work_dir, "results": str(RESULTS),
    }
    described = dict(OPTION_HELP)
    if row_names:
        described["rows"] = f"Comma-separated subset of {list(row_names)}."
    described.update(helps or {})
    added = [name for name, default in defaults.items() if default is not None]
    unknown = sorted(set(helps or {}) - set(added))
    if unknown:
        raise ValueError(f"helps names {unknown}, which this parser does not have (it has {added})")
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name in added:
        kind = {"type": OPTION_TYPE[name]} if name in OPTION_TYPE else {}
        choices = {"choices": ("cpu", "cuda")} if name == "device" else {}
        parser.add_argument(f"--{name}", default=defaults[name], help=described[name], **kind, **choices)
    what = "the markdown and the plot" if plots else "the markdown"
    parser.add_argument("--render_only", action="store_true",
                        help=f"Measure nothing: rewrite {what} from the results' JSON.")
    return parser


def chosen_rows(parser: argparse.ArgumentParser, value: str, row_names: Collection[str]) -> list[str]:
    """The rows of a ``--rows`` value, in its order; a name not among ``row_names`` is a usage error."""
    rows = [row.strip() for row in value.split(",") if row.strip()]
    unknown = [row for row in rows if row not in row_names]
    if unknown:
        parser.error(f"--rows: {unknown} are not rows; use some of {list(row_names)}.")
    return rows


def provenance(name: str) -> dict[str, str]:
    """How a result was made: the command as run (``python -m benchmarks.experiments.<name> …``) and the commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"command": " ".join(["python", "-m", f"benchmarks.experiments.{name}", *sys.argv[1:]]), "commit": commit}


def write_results(report: dict, results: str | Path, name: str, render: Callable[[dict, Path], None]) -> None:
    """Write ``<results>/<name>.json`` and its markdown (``render``)."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    render(report, results)


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
