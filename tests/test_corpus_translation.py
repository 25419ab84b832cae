"""Translation at corpus scale (`deepnmt translate` of a training file, `hf_deepnmt_training.translate.translate_corpus`): the
source side of a training file, one output line per record; shares translated by several processes merge back into
input order; every interruption resumes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PARALLEL

from hf_deepnmt import UserInputError
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.translate import Shard, training_file_sources, translate_corpus

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


class EchoEngine:
    """An engine whose "translation" is the source itself: the order of the output shows which line went where."""

    max_positions = 64

    def __init__(self) -> None:
        self.translated: list[list[int]] = []

    def generate(self, sources, num_beams=4, max_new_tokens=16, **kwargs):
        self.translated += [list(ids) for ids in sources]
        return [list(ids) for ids in sources]


def ONE_AFTER_ANOTHER() -> None:
    """The rendezvous of shares played one after another in one process (a launcher's barrier would wait forever)."""


def sentences(count: int) -> list[str]:
    """``count`` sentences of many lengths, every 7th empty."""
    words = " ".join(source for source, _ in PARALLEL).split()
    return ["" if i % 7 == 3 else " ".join(words[i % 11: i % 11 + 1 + i % 9]) for i in range(count)]


def test_shares_of_three_processes_merge_back_into_input_order(tiny_tokenizer, tmp_path):
    """Ranks 2, 1, 0 translate their strided shares (one after another here; in parallel under a launcher): rank
    0's merge gives exactly the one-process output, and nothing is left beside it."""
    lines = sentences(23)
    alone = tmp_path / "alone.txt"
    translate_corpus(EchoEngine(), tiny_tokenizer, lines, alone, batch_size=4, window=5)
    expected = alone.read_text(encoding="utf-8").splitlines()
    assert len(expected) == 23 and expected[3] == "" and expected[1] != expected[2]
    shared = tmp_path / "shared.txt"
    engines = {}
    for rank in (2, 1, 0):
        engines[rank] = EchoEngine()
        result = translate_corpus(engines[rank], tiny_tokenizer, lines, shared, shard=Shard(rank, 3), batch_size=4,
                                  window=5, poll_seconds=0.01, rendezvous=ONE_AFTER_ANOTHER)
        assert result.merged == (rank == 0)
        if rank:
            assert not shared.exists()  # only rank 0 writes the output, once every share is done
    assert shared.read_text(encoding="utf-8").splitlines() == expected
    assert sorted(path.name for path in tmp_path.iterdir()) == ["alone.txt", "shared.txt"]
    shares = {rank: tiny_tokenizer.batch_decode(engine.translated, skip_special_tokens=True)
              for rank, engine in engines.items()}
    assert sorted(shares[1]) == sorted(line for line in lines[1::3] if line)  # a strided share, nothing else


def test_a_killed_sharded_run_resumes_where_each_process_stopped(tiny_tokenizer, tmp_path):
    """A one-process run killed after 5 lines is continued by two processes: the 5 lines are kept, the rest is
    shared out; rank 0 killed after 2 lines of its part (a torn third) and rank 1 done: on --resume rank 1
    translates nothing, rank 0 only its missing lines, and the merge equals the uninterrupted output."""
    lines = sentences(17)
    expected_path = tmp_path / "expected.txt"
    translate_corpus(EchoEngine(), tiny_tokenizer, lines, expected_path, batch_size=4)
    expected = expected_path.read_text(encoding="utf-8").splitlines(keepends=True)

    output = tmp_path / "out.txt"
    output.write_text("".join(expected[:5]) + "torn", encoding="utf-8")  # the one-process run died in line 6
    rest = expected[5:]
    part0, part1 = Shard(0, 2).part(output, 5), Shard(1, 2).part(output, 5)
    part1.write_text("".join(rest[1::2]), encoding="utf-8")
    part1.with_name(part1.name + ".done").write_text(json.dumps({"lines": len(rest[1::2])}))
    part0.write_text("".join(rest[0::2][:2]) + "half a li", encoding="utf-8")
    engines = [EchoEngine(), EchoEngine()]
    assert translate_corpus(engines[1], tiny_tokenizer, lines, output, resume=True, shard=Shard(1, 2),
                            rendezvous=ONE_AFTER_ANOTHER).translated == 0
    result = translate_corpus(engines[0], tiny_tokenizer, lines, output, resume=True, shard=Shard(0, 2),
                              poll_seconds=0.01, rendezvous=ONE_AFTER_ANOTHER)
    assert (result.resumed_from, result.translated) == (2, len(rest[0::2]) - 2)
    assert output.read_text(encoding="utf-8") == "".join(expected)
    assert engines[1].translated == [] and len(engines[0].translated) <= len(rest[0::2]) - 2

    stale = Shard(0, 3).part(output, 0)
    stale.write_text("x\n")
    with pytest.raises(UserInputError, match=r"has parts of a run with another number of processes .*\.part0-of-3\); "
                                             "resume with the processes that run had"):
        translate_corpus(EchoEngine(), tiny_tokenizer, lines, output, resume=True, shard=Shard(0, 2),
                         rendezvous=ONE_AFTER_ANOTHER)


def test_a_process_that_starts_late_resumes_from_the_same_point_as_the_others(tiny_tokenizer, tmp_path):
    """Two processes resume a run whose rank 1 had finished its share: rank 0 has lines left, rank 1 none. Rank 1
    starts only once rank 0 is under way (as a slower-loading process under torchrun may). The rendezvous holds rank 0
    until rank 1 has read the starting point, so rank 1 sees its marker rather than the merged output (whose length
    it would take as a new starting point, leaving a stray marker behind): both resume from line 4, and the merge
    equals the uninterrupted output with nothing left beside it."""
    import threading

    lines = sentences(21)
    expected_path = tmp_path / "expected.txt"
    translate_corpus(EchoEngine(), tiny_tokenizer, lines, expected_path, batch_size=4)
    expected = expected_path.read_text(encoding="utf-8").splitlines(keepends=True)
    output = tmp_path / "out.txt"
    output.write_text("".join(expected[:4]), encoding="utf-8")
    part1 = Shard(1, 2).part(output, 4)
    part1.write_text("".join(expected[4:][1::2]), encoding="utf-8")
    part1.with_name(part1.name + ".done").write_text(json.dumps({"lines": len(expected[4:][1::2])}))

    barrier, arrived, results = threading.Barrier(2, timeout=60), [threading.Event(), threading.Event()], {}

    def run(rank: int) -> None:
        def rendezvous() -> None:
            arrived[rank].set()
            barrier.wait()

        results[rank] = translate_corpus(EchoEngine(), tiny_tokenizer, lines, output, resume=True,
                                         shard=Shard(rank, 2), poll_seconds=0.01, rendezvous=rendezvous)

    first = threading.Thread(target=run, args=(0,))
    first.start()
    while first.is_alive() and not arrived[0].wait(0.05):
        pass  # until rank 0 has read its starting point and waits for the others (or, unheld, has finished)
    second = threading.Thread(target=run, args=(1,))
    second.start()
    first.join(60)
    second.join(60)
    assert (results[1].resumed_from, results[1].translated) == (8, 0)  # its marker: nothing to translate
    assert (results[0].resumed_from, results[0].translated, results[0].merged) == (0, 9, True)
    assert output.read_text(encoding="utf-8") == "".join(expected)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["expected.txt", "out.txt"]


def test_several_processes_without_a_launcher_are_told_to_use_one(tiny_tokenizer, tmp_path, monkeypatch):
    """RANK / WORLD_SIZE set by hand, without the MASTER_ADDR / MASTER_PORT of a launcher: one sentence, since the
    processes could not meet before changing the shared files."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(UserInputError, match=r"^WORLD_SIZE=2 without MASTER_ADDR and MASTER_PORT: several processes "
                                             r"translate one file only when started by a launcher"):
        translate_corpus(EchoEngine(), tiny_tokenizer, sentences(5), tmp_path / "out.txt", shard=Shard(1, 2))


def test_the_source_side_of_a_training_file_is_one_line_per_record(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    records = [{"translation": {"en": " In  the beginning. ", "es": "En el principio."}},
               {"translation": {"en": "", "es": "Vacía."}}, {"translation": {"en": "And God said.", "es": "Y dijo."}}]
    jsonl.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    assert list(training_file_sources(jsonl, "en", "es")) == ["In the beginning.", "", "And God said."]
    (tmp_path / "pairs.en").write_text("One.\nTwo.\n", encoding="utf-8")
    (tmp_path / "pairs.es").write_text("Uno.\nDos.\n", encoding="utf-8")
    assert list(training_file_sources(tmp_path / "pairs", "en", "es")) == ["One.", "Two."]


def test_which_inputs_are_training_files(tmp_path):
    """--input_format auto: JSON(-lines) files and a PREFIX of PREFIX.<source_lang> files are training files; text
    and TSV files are lines of text unless --input_format parallel says otherwise."""
    from hf_deepnmt_training.cli import parallel_input

    (tmp_path / "pairs.en").write_text("One.\n", encoding="utf-8")
    for name, expected in (("train.jsonl", True), ("train.json.gz", True), ("news.txt", False),
                           ("train.tsv", False), ("pairs", True), ("missing", False)):
        assert parallel_input(str(tmp_path / name), "auto", "en") is expected, name
    assert parallel_input("corpus:web-sparv/train.jsonl.gz", "auto", None)
    assert parallel_input(str(tmp_path / "train.tsv"), "parallel", "en")
    assert not parallel_input(str(tmp_path / "train.jsonl"), "text", "en")
    assert not parallel_input("-", "auto", "en")


def test_translate_refuses_what_a_sharded_or_training_file_run_cannot_do(tiny_folder, tmp_path, monkeypatch, capsys):
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n", encoding="utf-8")
    for argv, words in ((["--input", str(source), "--input_format", "parallel", "--source_lang", "en"],
                         "is read with both --source_lang and --target_lang"),
                        (["--input", str(tmp_path / "train.jsonl")], "is read with both --source_lang and"),
                        (["--input_format", "parallel", "--source_lang", "en", "--target_lang", "es"],
                         "give it as --input FILE"),
                        (["--input", str(source), "--weights", "1", "2"], "--weights has 2 values for 1 --model"),
                        (["--input", str(source), "--engine", "onnx"], "needs an ONNX export")):
        assert main(["translate", "--model", str(tiny_folder), *argv]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and words in error[0], error
    assert main(["translate", "--model", str(tiny_folder), str(tiny_folder), "--engine", "ctranslate2",
                 "--input", str(source)]) == 2
    assert "is not allowed for an ensemble of 2 models" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["translate", "--model", str(tiny_folder), "--input", str(source)]) == 2
    assert "2 processes translate shares of one --input FILE into one --output FILE" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_torchrun_two_processes_translate_a_training_file_in_input_order(tiny_tokenizer, tmp_path):
    """`torchrun --nproc_per_node 2 deepnmt translate` of a JSON-lines training file (2 CPU processes): the merged
    output is the one-process output, line for line in input order; killed and resumed, the same."""
    from export_cases import trained_variant

    folder = tmp_path / "model"
    trained_variant("post_ln", tiny_tokenizer).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"translation": {"en": line, "es": "x"}}) + "\n" for line in sentences(21)),
                    encoding="utf-8")
    argv = ["translate", "--model", str(folder), "--input", str(data), "--source_lang", "en", "--target_lang", "es",
            "--num_beams", "2", "--batch_size", "4", "--window", "6", "--threads", "1"]
    assert main([*argv, "--output", str(tmp_path / "one.txt")]) == 0
    expected = (tmp_path / "one.txt").read_text(encoding="utf-8").splitlines()
    assert len(expected) == 21 and len(set(expected)) > 10

    output = tmp_path / "two.txt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(_free_port()), "-m", "hf_deepnmt_training.cli", *argv, "--output", str(output)]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.read_text(encoding="utf-8").splitlines() == expected
    assert "2 processes' parts merged into" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("two")) == ["two.txt"]

    output.write_text("\n".join(expected[:4]) + "\n", encoding="utf-8")  # a run killed after 4 lines
    part1 = Shard(1, 2).part(output, 4)
    part1.write_text("".join(line + "\n" for line in expected[4:][1::2]), encoding="utf-8")
    part1.with_name(part1.name + ".done").write_text(json.dumps({"lines": len(expected[4:][1::2])}))
    command[command.index("--master_port") + 1] = str(_free_port())
    result = subprocess.run([*command, "--resume"], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 1/2: its 8 lines are translated already" in result.stderr
    assert output.read_text(encoding="utf-8").splitlines() == expected


# ------------------------------------------------------------------------------------------------ the device
@pytest.fixture
def two_gpus(monkeypatch):
    """torch as it is on a machine with two CUDA devices (this CPU machine has none: only the choice is tested, the
    model stays where it is)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_the_device_is_this_process_gpu_when_there_is_one(two_gpus, monkeypatch):
    """auto and ``cuda`` = cuda:LOCAL_RANK (modulo the devices: four processes on two GPUs share them); an index
    is taken as given; one sentence for an index the machine lacks, a bad LOCAL_RANK or an unknown name."""
    import torch

    from hf_deepnmt_training.translate import translation_device

    assert translation_device(None) == translation_device("auto") == torch.device("cuda", 0)
    for rank, index in (("1", 1), ("3", 1), ("2", 0)):
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert translation_device(None) == translation_device("cuda") == torch.device("cuda", index)
    assert translation_device("cuda:0") == torch.device("cuda", 0)
    assert translation_device("cpu") == torch.device("cpu")
    for requested, words in (("cuda:2", "`--device` = 'cuda:2' is not available: this machine has 2 CUDA device(s), "
                                        "cuda:0 to cuda:1."),
                             ("gpu", "`--device` = 'gpu' is not allowed; use auto, cpu, cuda, cuda:N or mps."),
                             ("xla", "`--device` = 'xla' is not allowed; use auto, cpu, cuda, cuda:N or mps.")):
        with pytest.raises(UserInputError) as caught:
            translation_device(requested)
        assert str(caught.value) == words
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(UserInputError, match="LOCAL_RANK='first' is not allowed"):
        translation_device(None)


def test_without_a_gpu_the_device_is_the_cpu_and_cuda_is_one_sentence(tiny_folder, tmp_path, monkeypatch, capsys):
    import torch

    from hf_deepnmt_training.translate import translation_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert translation_device(None) == translation_device("auto") == torch.device("cpu")
    with pytest.raises(UserInputError, match="`--device` = 'cuda' is not available: torch .* sees no CUDA device"):
        translation_device("cuda")
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--model", str(tiny_folder), "--input", str(source), "--device", "cuda"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "`--device` = 'cuda' is not available: torch" in error[0], error


def test_translate_and_evaluate_put_the_torch_engine_on_the_process_gpu(two_gpus, tiny_folder, tmp_path,
                                                                        monkeypatch, capsys):
    """On a machine with GPUs, `deepnmt translate` (one model, an ensemble) and `deepnmt evaluate` move the model to
    cuda:LOCAL_RANK — before, they translated on the CPU whatever the machine had — and ``--device cpu`` keeps it
    there; an exported engine given a GPU is one sentence."""
    from hf_deepnmt_training import translate

    placed: list[str] = []

    def place(model, device):  # records the move instead of making it (no GPU here)
        placed.append(str(device))
        return model

    monkeypatch.setattr(translate, "place", place)
    monkeypatch.setenv("LOCAL_RANK", "1")
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\nThe light shines.\n", encoding="utf-8")
    for run, (models, device, expected) in enumerate((([tiny_folder], None, "cuda:1"),
                                                      ([tiny_folder, tiny_folder], None, "cuda:1"),
                                                      ([tiny_folder], "cuda:0", "cuda:0"), ([tiny_folder], "cpu", "cpu"))):
        placed.clear()
        output = tmp_path / f"out-{run}.txt"
        argv = ["translate", "--model", *map(str, models), "--input", str(source), "--output", str(output),
                "--num_beams", "2", *(["--device", device] if device else [])]
        assert main(argv) == 0
        assert placed == [expected], (argv, placed)
        assert len(output.read_text(encoding="utf-8").splitlines()) == 2
        described = capsys.readouterr().err
        assert (f"on {expected}" in described) == (expected != "cpu"), described
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": source, "es": target}}) + "\n"
                                 for source, target in PARALLEL[:4]), encoding="utf-8")
    placed.clear()
    assert main(["evaluate", str(tiny_folder), "--test_file", str(test_file), "--source_lang", "en",
                 "--target_lang", "es", "--num_beams", "2", "--reliance_pairs", "2"]) == 0
    assert placed == ["cuda:1"]

    from hf_deepnmt_training import serve

    monkeypatch.setattr(serve, "choose_engine", lambda folder, engine, cuda, command: ("onnx", Path(folder)))
    with pytest.raises(Exception, match="`--device` = 'cuda:0' runs the torch engine only, and .* is run by the onnx "
                                        "engine, on the CPU here"):
        translate.load_translation_engine([str(tiny_folder)], device="cuda:0")
    placed.clear()
    monkeypatch.setattr("hf_deepnmt.export.load_engine", lambda folder, name, **kwargs: "an onnx engine")
    assert translate.load_translation_engine([str(tiny_folder)])[0] == "an onnx engine"  # auto: the export's own
    assert placed == []


def test_an_over_long_line_is_named_by_its_line_in_the_input(tiny_tokenizer, tmp_path, capsys):
    """Issue 66 item 2: the note on an over-long line names its line of the whole input, in a process's strided
    share (rank 1 of 2 translates lines 2, 4, 6, …) and after a resumed run's complete lines."""
    long_line = " ".join(source for source, _ in PARALLEL * 3)
    lines = sentences(9)
    lines[3] = lines[6] = long_line  # input lines 4 and 7
    translate_corpus(EchoEngine(), tiny_tokenizer, lines, tmp_path / "shared.txt", shard=Shard(1, 2), batch_size=4,
                     window=2, rendezvous=ONE_AFTER_ANOTHER)
    assert [line.split(" has ")[0] for line in capsys.readouterr().err.splitlines() if " tokens, more than " in line] \
        == ["[deepnmt] line 4"]  # line 7 is rank 0's
    output = tmp_path / "alone.txt"
    output.write_text("".join(line + "\n" for line in lines[:5]), encoding="utf-8")
    translate_corpus(EchoEngine(), tiny_tokenizer, lines, output, resume=True, window=2)
    assert [line.split(" has ")[0] for line in capsys.readouterr().err.splitlines() if " tokens, more than " in line] \
        == ["[deepnmt] line 7"]
    assert output.read_text(encoding="utf-8").splitlines()[6] == long_line
