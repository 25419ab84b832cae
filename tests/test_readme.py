"""README.md stays true: its API tour runs as written, and its two commands exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_api_tour_runs_as_written(tmp_path, monkeypatch, capsys):
    tour = README.split("## API tour", 1)[1]
    code = re.search(r"```python\n(.*?)```", tour, re.S).group(1)
    assert len(code.strip().splitlines()) == 10
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (API tour)", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    assert "translation_text" in printed
    assert (tmp_path / "my-deep-nmt" / "model.safetensors").exists()


def test_the_two_setup_commands_are_what_run_sh_and_ci_run():
    setup = README.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in setup.strip().splitlines()]
    assert commands == ["bash run.sh quickstart", "bash run.sh test"]
    run_sh = (ROOT / "run.sh").read_text()
    assert "quickstart)" in run_sh and "test)" in run_sh and "torch==2.13.0" in run_sh
    assert "bash run.sh test" in (ROOT / ".ci" / "run").read_text()
