"""PNG plots of a training run from `trainer.state.log_history`: every loss component, and validation metrics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

NON_LOSS_KEYS = {"epoch", "step", "grad_norm", "learning_rate", "total_flos", "train_runtime",
                 "train_samples_per_second", "train_steps_per_second", "train_loss"}


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for entry in history:
        if key in entry and isinstance(entry[key], (int, float)):
            steps.append(int(entry.get("step", len(steps))))
            values.append(float(entry[key]))
    return steps, values


def training_component_names(history: Sequence[dict[str, Any]]) -> list[str]:
    """Loss components logged during training (``loss``, ``nll``, ``ddr``, …), in a stable order."""
    names: list[str] = []
    for entry in history:
        if "loss" not in entry:
            continue
        for key, value in entry.items():
            if key not in NON_LOSS_KEYS and not key.startswith("eval_") and isinstance(value, (int, float)):
                if key not in names:
                    names.append(key)
    return sorted(names, key=lambda name: (name != "loss", name))


def plot_history(history: Sequence[dict[str, Any]], output_dir: str | Path) -> list[Path]:
    """Write ``loss_components.png`` (one panel per component + learning rate) and ``validation.png``
    (every ``eval_*`` metric: BLEU, chrF, TER, loss, li2022 source reliance) to ``output_dir``; return the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    def panels(names: list[str], title: str, file_name: str, label=lambda name: name) -> Path:
        fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.2 * len(names)), sharex=True, squeeze=False)
        for axis, name in zip(axes[:, 0], names):
            steps, values = _series(history, name)
            axis.plot(steps, values, marker="o" if len(steps) < 30 else None)
            axis.set_ylabel(label(name))
            axis.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("optimizer step")
        fig.suptitle(title)
        fig.tight_layout()
        path = output_dir / file_name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    written: list[Path] = []
    components = [name for name in training_component_names(history) + ["learning_rate"] if _series(history, name)[0]]
    if components:
        written.append(panels(components, "training loss components", "loss_components.png"))
    metrics = sorted({key for entry in history for key in entry
                      if key.startswith("eval_") and key.split("_", 1)[1] in ("bleu", "chrf", "ter", "loss",
                                                                                 "source_reliance")})
    if metrics:
        written.append(panels(metrics, "validation", "validation.png", lambda name: name.replace("eval_", "valid ")))
    return written
