"""What the built wheel holds and what runs from it: the experiments of training/ run from an installed wheel, which
ships hf_deepnmt and the folders training/ and model_cards/ as hf_deepnmt_training and hf_deepnmt_model_cards (names
no user's training.py shadows) but not benchmarks (so training must never import it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "training" / "experiments").glob("*.py") if p.stem not in ("__init__",))


@pytest.mark.integration
def test_the_experiments_run_from_an_installed_wheel(tmp_path):
    source = tmp_path / "source"  # built from a copy: setuptools leaves a build/ folder beside the sources
    for name in ("hf_deepnmt", "training", "model_cards"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("hf_deepnmt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("hf_deepnmt_training/experiments/") for name in names)
    assert any(name.startswith("hf_deepnmt_model_cards/templates/") for name in names)
    assert not any(name.startswith(("benchmarks/", "training/", "model_cards/")) for name in names)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a wheel installs by unpacking; no scripts needed for `python -m`
    script = ("import importlib, sys\n"
              f"for name in {EXPERIMENTS!r}:\n"
              "    module = importlib.import_module('hf_deepnmt_training.experiments.' + name)\n"
              "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
              "import hf_deepnmt_training.cli, hf_deepnmt, hf_deepnmt_model_cards\n"
              "assert 'benchmarks' not in sys.modules\n"
              "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    # outside the repository, so that nothing but the wheel's files can be imported from it
    result = subprocess.run([sys.executable, "-c", script, str(site)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    for name in ("dou2018_miniature", "quickstart_probes", "li2022_regime"):
        shown = subprocess.run([sys.executable, "-m", f"hf_deepnmt_training.experiments.{name}", "--help"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0 and "usage" in shown.stdout, (name, shown.stderr[-2000:])
