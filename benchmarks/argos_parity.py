"""A trained model through Argos Translate: ``deepnmt export --format argos`` installed into an empty Argos folder,
the embedded test set translated by ``argostranslate``, against CTranslate2 running our ``--format ctranslate2``
export of the same model, fed our tokenizer's ids, with Argos's search (beam 4, length penalty 0.2,
``replace_unknowns``, one hypothesis): how many outputs are identical, and both BLEU scores.

    python -m benchmarks.argos_parity --model runs/quickstart [--sentences 998]

Argos's sentence splitter (a MiniSBD model it downloads on first use) is replaced by one sentence per verse, which
the test set is; ``ARGOS_COMPUTE_TYPE=default`` runs the weights as exported (docs/fast-inference.md, "Argos
Translate packages"). Needs the `export` extra and ``argostranslate`` (the `dev` extra). One thread throughout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Installs a package into an empty Argos folder and prints each text's hypotheses as JSON: argv = package, a JSON
# file of texts, source code, target code, number of hypotheses.
ARGOS_RUN = """
import json, sys
import argostranslate.package, argostranslate.translate

class OneSentence:  # Argos's own splitter downloads a MiniSBD model on first use; offline, each text is one sentence
    def split_sentences(self, text):
        return [text]

argostranslate.package.install_from_path(sys.argv[1])
languages = {language.code: language for language in argostranslate.translate.get_installed_languages()}
translation = languages[sys.argv[3]].get_translation(languages[sys.argv[4]])
getattr(translation, "underlying", translation).sentencizer = OneSentence()  # under Argos's cache wrapper
texts, count = json.load(open(sys.argv[2], encoding="utf-8")), int(sys.argv[5])
print(json.dumps({"languages": sorted(languages), "translations": [
    [hypothesis.value for hypothesis in translation.hypotheses(text, num_hypotheses=count)] for text in texts]}))
"""


def argos_translations(package: Path, texts: Sequence[str], source: str, target: str, hypotheses: int,
                       work: Path) -> tuple[list[str], list[list[str]]]:
    """The languages Argos lists and each text's ``hypotheses`` translations, from ``package`` installed by
    ``argostranslate`` into an empty folder under ``work`` (``ARGOS_COMPUTE_TYPE=default``: the weights as
    exported), in a process of its own (Argos reads its settings from the environment at import)."""
    (work / "texts.json").write_text(json.dumps(list(texts)), encoding="utf-8")
    environment = {**os.environ, "ARGOS_PACKAGES_DIR": str(work / "packages"), "HOME": str(work / "home"),
                   "XDG_DATA_HOME": str(work / "data"), "XDG_CACHE_HOME": str(work / "cache"),
                   "XDG_CONFIG_HOME": str(work / "config"), "ARGOS_DEVICE_TYPE": "cpu", "ARGOS_INTRA_THREADS": "1",
                   "OMP_NUM_THREADS": "1", "ARGOS_COMPUTE_TYPE": "default"}  # "auto" lets CTranslate2 quantize
    run = subprocess.run([sys.executable, "-c", ARGOS_RUN, str(package), str(work / "texts.json"), source, target,
                          str(hypotheses)], env=environment, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"argostranslate failed:\n{run.stderr[-3000:]}")
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    return answer["languages"], answer["translations"]


def ctranslate2_translations(folder: Path, tokenizer: Any, texts: Sequence[str], hypotheses: int) -> tuple[
        list[list[str]], list[list[str]]]:
    """What CTranslate2 gives for our ``--format ctranslate2`` export in ``folder``, fed our tokenizer's ids, with
    Argos's search (beam max(4, hypotheses), length penalty 0.2, ``replace_unknowns``): each text's token lists and
    their texts (decoded as Argos decodes: ``_`` also becomes a space)."""
    import ctranslate2

    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in texts],
        beam_size=max(4, hypotheses), num_hypotheses=hypotheses, length_penalty=0.2, replace_unknowns=True,
        max_batch_size=32, batch_type="tokens")
    tokens = [list(result.hypotheses) for result in results]
    return tokens, [[tokenizer.decode(tokenizer.convert_tokens_to_ids(each), skip_special_tokens=True)
                     .replace("_", " ") for each in hypotheses_] for hypotheses_ in tokens]


def deepnmt(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "hf_deepnmt_training.cli", *arguments], check=True, cwd=REPO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A saved model folder of ours with one recorded pair.")
    parser.add_argument("--sentences", type=int, default=998, help="Test verses to translate (default: all 998).")
    args = parser.parse_args(argv)

    import sacrebleu
    from transformers import AutoTokenizer

    from hf_deepnmt_training.corpus import corpus_dir

    config = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    (task,) = [name for name in config.get("task_specific_params") or {} if name.startswith("translation_")]
    source, target = task.removeprefix("translation_").split("_to_")
    with gzip.open(corpus_dir() / "test.jsonl.gz", "rt", encoding="utf-8") as handle:
        pairs = [json.loads(line)["translation"] for line in handle][: args.sentences]
    texts, references = [pair[source] for pair in pairs], [pair[target] for pair in pairs]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        deepnmt("export", args.model, str(work / "argos"), "--format", "argos")
        deepnmt("export", args.model, str(work / "ct2"), "--format", "ctranslate2")
        package = next((work / "argos").glob("*.argosmodel"))
        _, translations = argos_translations(package, texts, source, target, 1, work)
        argos = [hypotheses[0] for hypotheses in translations]
        _, decoded = ctranslate2_translations(work / "ct2", AutoTokenizer.from_pretrained(work / "ct2"), texts, 1)
    ours = [hypotheses[0] for hypotheses in decoded]
    same = sum(a == b for a, b in zip(argos, ours))
    print(f"{args.model} ({source}→{target}), {len(texts)} test verses: Argos's output identical to CTranslate2 on "
          f"our export with the same search for {same}/{len(texts)}; BLEU through Argos "
          f"{sacrebleu.corpus_bleu(argos, [references]).score:.2f}, through CTranslate2 "
          f"{sacrebleu.corpus_bleu(ours, [references]).score:.2f}")
    for got, expected in [(a, b) for a, b in zip(argos, ours) if a != b][:3]:
        print(f"  argos: {got}\n  ct2:   {expected}")
    return 0 if same == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
