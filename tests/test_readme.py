"""README.md stays true: every Python block runs on its own as written, the command-line vocabulary it states is what
each command's `--help` offers, and its two set-up commands exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def python_blocks(text: str = README) -> list[tuple[str, str]]:
    """Every ```python block of ``text`` as (name, code); the name is the slug of the section heading the block is
    under, numbered when a section holds several."""
    blocks: list[tuple[str, str]] = []
    heading = "top"
    for match in re.finditer(r"^(#{2,4}) (.+?)$|^```python\n(.*?)^```", text, re.S | re.M):
        if match.group(1):
            heading = "-".join(re.findall(r"[a-z0-9]+", match.group(2).lower())[:4])
        else:
            blocks.append((heading, match.group(3)))
    names = [name for name, _ in blocks]
    return [(f"{name}-{names[:i].count(name) + 1}" if names.count(name) > 1 else name, code)
            for i, (name, code) in enumerate(blocks)]


BLOCKS = python_blocks()
EXPORT_EXTRA = ("onnx", "onnxruntime", "onnxscript")  # what the blocks that export to ONNX need (the export extra)

# Run a block as a script, then check that it ran this checkout's code (not another installed copy).
LAUNCHER = """\
import runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
for name in ("hf_deepnmt", "training", "model_cards"):
    module = sys.modules.get(name)
    if module is not None and not module.__file__.startswith(sys.argv[2]):
        sys.exit(f"the block imported {name} from {module.__file__}, not from the checkout {sys.argv[2]}")
"""


def test_the_readme_has_the_python_blocks_this_file_runs():
    """A renamed section or a lost fence shows here rather than as a block that silently stopped being run."""
    names = [name for name, _ in BLOCKS]
    assert names[:2] == ["api-tour-1", "api-tour-2"], names
    for section in ("liu2020-admin", "li2022-deep-decoder-cad", "dou2018-deep-representations", "meng2019-dtmt-deep",
                    "fast-inference-onnx-runtime"):
        assert any(name.startswith(section) for name in names), (section, names)


@pytest.mark.integration
@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_every_python_block_runs_on_its_own(name, code, tmp_path):
    """Each ```python block of README.md, alone, in a fresh interpreter and an empty working directory, offline (a
    Hub download fails), with an empty Hugging Face cache and one thread."""
    if "onnx" in code.lower():
        missing = [module for module in EXPORT_EXTRA if importlib.util.find_spec(module) is None]
        if missing:
            pytest.skip(f"needs the export extra (pip install 'hf_deepnmt[export]'): {', '.join(missing)} missing")
    script = tmp_path / "readme_block.py"
    script.write_text(code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HOME": str(tmp_path / "hf_home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run([sys.executable, "-c", LAUNCHER, str(script), str(ROOT)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"README block {name!r} failed:\n{code}\n--- stderr ---\n{result.stderr[-4000:]}"


def test_the_language_block_does_what_its_prose_says(tmp_path, monkeypatch, capsys):
    """The language-pair block of the API tour, run alone, prints what its comments say, and the prose after it holds:
    another language raises, naming the argument, the value and the model's pair."""
    code = next(code for _, code in BLOCKS if "recorded_language_pairs" in code)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    exec(compile(code, "README.md (API tour, languages)", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[]" and all("translation_text" in line for line in printed[1:3])
    assert type(namespace["explicit"]) is type(namespace["translate"]) is namespace["hf_deepnmt"].TranslationPipeline
    pipeline = namespace["pipeline"]
    with pytest.raises(ValueError, match="`tgt_lang` = 'fr' is not allowed; this model translates en → es"):
        namespace["translate"]("In the beginning.", tgt_lang="fr")
    with pytest.raises(ValueError, match="`task` = 'translation_en_to_fr' is not allowed; this model translates en"):
        pipeline("translation_en_to_fr", model="en-es")


# ----------------------------------------------------------------------------------------------------------------
# The command-line vocabulary: README's table "| option | commands that take it |", checked against `--help`.
# ----------------------------------------------------------------------------------------------------------------
def option_claims(text: str = README) -> list[tuple[str, str]]:
    """(command, option) for every command and option of README's table of shared options; ``option`` is a flag
    such as ``--model`` or ``POSITIONAL`` for "the model folder as a positional argument". A parenthesis in the
    commands column is a note, not a command."""
    table = text.split("| option | commands that take it |", 1)[1].split("\n\n", 1)[0]
    claims = []
    for row in table.strip().splitlines()[1:]:
        option_cell, command_cell = [cell.strip() for cell in row.strip().strip("|").split("|")]
        options = re.findall(r"`(--[a-z_]+)`", option_cell) or (["POSITIONAL"] if "positional" in option_cell
                                                                 else [])
        assert options, f"README's option table: no option in {option_cell!r}"
        commands = re.findall(r"`([a-z-]+)`", re.sub(r"\([^)]*\)", "", command_cell))
        assert commands, f"README's option table: no command in {command_cell!r}"
        claims += [(command, option) for option in options for command in commands]
    return claims


CLAIMS = option_claims()


def help_text(command: str, capsys) -> str:
    """What `deepnmt COMMAND --help` prints."""
    from hf_deepnmt_training.cli import main

    try:
        code = main([command, "--help"])
    except SystemExit as stop:  # argparse prints the help and exits
        code = stop.code
    assert code == 0, command
    return capsys.readouterr().out


def test_the_option_table_is_read():
    commands = {command for command, _ in CLAIMS}
    assert {"train", "evaluate", "diagnose", "translate", "export", "serve", "push"} <= commands
    assert {option for _, option in CLAIMS} == {"--model_name_or_path", "--model", "POSITIONAL", "--num_beams",
                                                "--source_lang", "--target_lang", "--engine"}


@pytest.mark.parametrize("command, option", CLAIMS, ids=[f"{command}:{option}" for command, option in CLAIMS])
def test_each_command_offers_the_options_the_readme_says(command, option, capsys):
    text = help_text(command, capsys)
    if option == "POSITIONAL":
        section = re.search(r"^positional arguments:\n(.*?)(?:\n\S|\Z)", text, re.S | re.M)
        assert section and "model" in section.group(1).lower(), f"`deepnmt {command} --help` has no positional " \
                                                                 f"model argument:\n{text}"
    else:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), \
            f"`deepnmt {command} --help` does not offer {option}:\n{text}"


def test_the_two_setup_commands_are_what_run_sh_and_ci_run():
    """README's two commands are run.sh's only two, and CI runs exactly the README's test command, nothing weaker
    (no marker filter, no test selection)."""
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


# ----------------------------------------------------------------------------------------------------------------
# README.md is for a user (issue 64): short, no wall of prose, every link lands, every figure names its source.
# Measurement histories and the reasoning behind defaults live in docs/ and benchmarks/, linked from here.
# ----------------------------------------------------------------------------------------------------------------
README_MAX_LINES = 250
PARAGRAPH_MAX_LINES = 8
FIGURE = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:×|%|min\b|GiB\b|BLEU\b|chrF\b)|\bBLEU\s+\*{0,2}\d")


def prose_paragraphs(text: str = README) -> list[list[str]]:
    """Runs of non-blank lines outside code fences, tables, headings and lists (a list item and its indented
    continuation lines are a list, not prose)."""
    paragraphs: list[list[str]] = []
    current: list[str] = []
    fenced = in_list = False

    def end() -> None:
        if current:
            paragraphs.append(current.copy())
            current.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            end()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip():
            end()
            in_list = False
        elif re.match(r"(?:[-*+]|\d+\.) ", line):
            end()
            in_list = True
        elif in_list and line.startswith(" "):
            continue
        elif line.startswith(("|", "#")):
            end()
        else:
            current.append(line)
    end()
    return paragraphs


def relative_links(text: str = README) -> list[str]:
    """The targets of README's Markdown links that are not URLs or in-page anchors."""
    outside_code = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", outside_code)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_short():
    lines = README.splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES}: move histories and details to docs/ "
        f"or benchmarks/ and link them")


def test_no_readme_paragraph_is_a_wall_of_text():
    long = [paragraph for paragraph in prose_paragraphs() if len(paragraph) > PARAGRAPH_MAX_LINES]
    assert not long, "README paragraphs over {} lines (use a list or a table, or move it to docs/):\n{}".format(
        PARAGRAPH_MAX_LINES, "\n\n".join("\n".join(paragraph) for paragraph in long))


def test_the_paragraph_reader_sees_prose_only():
    text = "a\nb\n\n- item\n  continued\n- item\n\n| a | b |\n|---|---|\n\n```bash\nx\ny\n```\n\nc\n"
    assert prose_paragraphs(text) == [["a", "b"], ["c"]]
    assert relative_links("[a](docs/a.md) [b](https://x.org) [c](#here) [d](b.md#part)\n```\n[e](no.md)\n```\n") \
        == ["docs/a.md", "b.md#part"]


def test_every_relative_link_of_the_readme_lands():
    links = relative_links()
    assert links, "README.md links to no page of docs/ or benchmarks/"
    for target in links:
        path, _, anchor = target.partition("#")
        file = ROOT / path
        assert file.exists(), f"README.md links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            anchors = {github_anchor(heading) for heading in
                       re.findall(r"^#{1,6} (.+)$", file.read_text(encoding="utf-8"), re.M)}
            assert anchor in anchors, f"README.md links to {target}: {path} has no heading with that anchor"


def measured_rows(text: str = README) -> list[list[str]]:
    """The rows of the table under "## What is measured", as lists of cells."""
    section = text.split("## What is measured", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and the rule
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def test_every_measured_figure_has_a_date_and_a_link():
    rows = measured_rows()
    assert len(rows) >= 5, rows
    for row in rows:
        assert re.search(r"\d", " ".join(row)), row
        assert any(re.fullmatch(r"20\d\d-\d\d-\d\d", cell) for cell in row), f"no date in the row {row}"
        assert re.search(r"\]\((?!https?:)[^)]+\)", row[-1]), f"no link to the page with the command in {row}"


def test_every_figure_in_the_readme_prose_links_to_its_source():
    """A figure in the README's prose (a time, a ratio, a BLEU score) sits in a paragraph that links to the page
    holding its command."""
    for paragraph in prose_paragraphs():
        text = "\n".join(paragraph)
        if FIGURE.search(text):
            assert re.search(r"\]\((?!https?:)[^)]+\)", text), f"a figure without a link to its source:\n{text}"
