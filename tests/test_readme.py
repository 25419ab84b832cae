"""README.md stays true: its API tour runs as written, and its two commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_api_tour_runs_as_written(tmp_path, monkeypatch, capsys):
    tour = README.split("## API tour", 1)[1].split("\n## ", 1)[0]
    code, languages = re.findall(r"```python\n(.*?)```", tour, re.S)
    assert len(code.strip().splitlines()) == 10
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    exec(compile(code, "README.md (API tour)", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "translation_text" in printed
    assert (tmp_path / "my-deep-nmt" / "model.safetensors").exists()

    # "Continuing the tour": the language pair, src_lang/tgt_lang, translation_en_to_es and pipeline_class=.
    exec(compile(languages, "README.md (API tour, languages)", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[]" and all("translation_text" in line for line in printed[1:3])
    assert type(namespace["explicit"]) is type(namespace["translate"]) is namespace["hf_deepnmt"].TranslationPipeline
    # The prose after the block: another language raises, naming the argument, the value and the model's pair.
    pipeline = namespace["pipeline"]
    with pytest.raises(ValueError, match="`tgt_lang` = 'fr' is not allowed; this model translates en → es"):
        namespace["translate"]("In the beginning.", tgt_lang="fr")
    with pytest.raises(ValueError, match="`task` = 'translation_en_to_fr' is not allowed; this model translates en"):
        pipeline("translation_en_to_fr", model="my-deep-nmt")


def test_the_two_setup_commands_are_what_run_sh_and_ci_run():
    """README's two commands are run.sh's only two, and CI runs exactly the README's test command, nothing weaker
    (no marker filter, no test selection)."""
    import subprocess

    setup = README.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in setup.strip().splitlines()]
    assert commands == ["bash run.sh quickstart", "bash run.sh test"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == ["bash run.sh test"], ci
    usage = subprocess.run(["bash", str(ROOT / "run.sh"), "no-such-command"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 2 and "usage: bash run.sh {quickstart|test}" in usage.stderr
    test_branch = (ROOT / "run.sh").read_text().split("  test)", 1)[1].split(";;", 1)[0]
    assert 'python" -m pytest "$@"' in test_branch and "integration" not in test_branch  # the whole suite
