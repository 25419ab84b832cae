"""What the built wheel holds and what runs from it: the wheel ships hf_deepnmt and the folders training/ and
model_cards/ as hf_deepnmt_training and hf_deepnmt_model_cards (names no user's training.py shadows) but not benchmarks,
its experiments included (so training must never import it); the experiments run from the repository's benchmarks/
against the installed wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "benchmarks" / "experiments").glob("*.py") if p.stem != "__init__")


@pytest.mark.integration
def test_the_wheel_leaves_out_the_experiments_and_they_run_against_it(tmp_path):
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
    assert "hf_deepnmt_training/cli.py" in names
    assert any(name.startswith("hf_deepnmt_model_cards/templates/") for name in names)
    assert not any(name.startswith(("benchmarks/", "training/", "model_cards/")) or "/experiments/" in name
                   for name in names)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a wheel installs by unpacking; no scripts needed for `python -m`
    env = {**os.environ, "PYTHONPATH": str(site)}
    # outside the repository, so that nothing but the wheel's files can be imported from it
    installed = ("import sys\n"
                 "import hf_deepnmt, hf_deepnmt_training.cli, hf_deepnmt_model_cards\n"
                 "for module in (hf_deepnmt, hf_deepnmt_training.cli, hf_deepnmt_model_cards):\n"
                 "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
                 "assert 'benchmarks' not in sys.modules\n"
                 "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", installed, str(site)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    # the experiments from a copy of benchmarks/ (their working directory), everything else from the wheel
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "benchmarks" / "experiments", checkout / "benchmarks" / "experiments",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
    shutil.copy2(ROOT / "benchmarks" / "__init__.py", checkout / "benchmarks" / "__init__.py")
    experiments = ("import importlib, sys\n"
                   f"for name in {EXPERIMENTS!r}:\n"
                   "    importlib.import_module('benchmarks.experiments.' + name)\n"
                   "import hf_deepnmt_training\n"
                   "assert hf_deepnmt_training.__file__.startswith(sys.argv[1]), hf_deepnmt_training.__file__\n"
                   "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", experiments, str(site)], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    for name in ("dou2018_miniature", "quickstart_probes", "li2022_regime"):
        shown = subprocess.run([sys.executable, "-m", f"benchmarks.experiments.{name}", "--help"], cwd=checkout,
                               env=env, capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0 and "usage" in shown.stdout, (name, shown.stderr[-2000:])
