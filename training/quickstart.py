"""The main job (`deepnmt quickstart`): train, evaluate, translate, and leave a shareable model folder.

Runs the ``quickstart`` recipe on the embedded WEB ↔ RV1909 corpus, then translates the first sentences of the
test books and prints a summary. Everything lands in one output folder: the model (safetensors, config,
generation config, tokenizer, the remote code and the translation pipeline), ``README.md`` (the model card),
``metrics.json``, ``loss_components.png``, ``validation.png``, ``test_translations.txt`` and
``sample_translations.md``.

The run time the card states is the one the quickstart prints (`hf_deepnmt_training.clock`): the card is written again with it
after the sample translations. The model card names no license unless ``--license`` is given (the embedded corpus is
in the public domain, which the card says of the data, not of the model).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime

from .clock import RunClock

SAMPLES = 5


def run_quickstart(output_dir: str | None, extra_args: Sequence[str], clock: RunClock | None = None) -> int:
    """`deepnmt quickstart`: the quickstart recipe through `hf_deepnmt_training.train.train` (``extra_args`` override it), five
    sample translations, and the summary; ``clock`` is the command's (default: started here)."""
    clock = clock if clock is not None else RunClock("quickstart")
    from .data import read_parallel_file
    from .recipes import resolve_path
    from .report import restate_run_time
    from .train import train
    from .translate import translate_sentences

    if output_dir is None:
        output_dir = f"runs/quickstart-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    outcome = train(["--recipe", "quickstart", "--output_dir", output_dir, *extra_args], clock=clock)
    if not outcome.trainer.is_world_process_zero():
        return 0
    folder = outcome.output_dir
    data_args = outcome.data_args
    test = read_parallel_file(resolve_path(data_args.test_file or "corpus:web-sparv/test.jsonl.gz"),
                              data_args.source_lang, data_args.target_lang, max_samples=SAMPLES)
    translations = translate_sentences(outcome.trainer.model, outcome.tokenizer, test.sources,
                                       num_beams=outcome.model_args.eval_num_beams, progress=False)
    lines = ["| source (en) | reference (es) | hf_deepnmt (es) |", "|---|---|---|"]
    for source, reference, hypothesis in zip(test.sources, test.targets, translations):
        lines.append(f"| {source} | {reference} | {hypothesis} |")
    (folder / "sample_translations.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    restate_run_time(outcome)  # the clock stops again: metrics.json and the card state the time printed below

    scores = outcome.test_scores
    print("\n".join([
        "",
        f"hf_deepnmt quickstart finished in {clock.minutes()} ({outcome.timings['train_seconds'] / 60:.1f} min "
        f"training, {outcome.trainer.state.global_step} steps) -> {folder}",
        f"test ({scores.num_sentences} verses, beam {outcome.model_args.eval_num_beams}): BLEU {scores.bleu}  "
        f"chrF {scores.chrf}  TER {scores.ter}" if scores else "test: not evaluated",
        f"  {scores.signatures['bleu']}" if scores else "",
        "",
        *[f"  en: {s}\n  es: {t}\n" for s, t in zip(test.sources, translations)],
        f"model card: {folder / 'README.md'}   plots: {folder / 'loss_components.png'}, {folder / 'validation.png'}",
        f"try it: python -c \"from transformers import pipeline; print(pipeline('translation', model='{folder}', "
        "trust_remote_code=True)('The light shines in the darkness.'))\"",
    ]), file=sys.stdout)
    return 0
