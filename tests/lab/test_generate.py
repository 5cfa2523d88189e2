"""`cape generate`: a tiny lm study (rotary, abspos with an 8-row table, a train_as row) trained
in seconds, then greedy generation against `CausalLM.generate` and against full forwards,
sampling seeds, the sliding window of a learned table, a run without model.json brought to it by
scripts/migrate_runs.py, the command's output and its errors."""

from __future__ import annotations

import io
import json
import random
import shutil

import pytest
import torch

from cape.lab.apps.generate import (
    encode_prompt,
    generate_ids,
    generate_text,
    load_lm,
    readable_context,
)
from cape.lab.cli import main
from cape.lab.experiments import resolve_config
from cape.lab.experiments.lm.config import LMConfig
from cape.lab.experiments.lm.experiment import LM as exp
from cape.lab.experiments.lm.presets import PRESETS

WORDS = "in the beginning god created the heaven and the earth and the earth was without form"
ROWS = (
    "[{name: rotary, position: rotary}, "
    "{name: abspos, position: abspos, options: {num_positions: 8}}, "
    "{name: rotary YaRN, position: rotary, train_as: rotary, eval_options: {scaling: yarn}}]"
)
PROMPT = "in the"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run folders of a tiny study: 4 steps of a 1-layer d16 model on a .txt folder."""
    tmp = tmp_path_factory.mktemp("gen")
    (tmp / "txt").mkdir()
    rng = random.Random(0)
    for i in range(40):
        (tmp / "txt" / f"d{i:02d}.txt").write_text(
            " ".join(rng.choice(WORDS.split()) for _ in range(60))
        )
    sets = [
        f"data.corpus={tmp / 'txt'}", f"data.root={tmp / 'data'}", "data.context=8",
        "data.val_tokens=64", "data.train_windows=100", "model.dim=16", "model.heads=2",
        "model.layers=1", "model.ffn_dim=32", "train.steps=4", "train.batch_size=4",
        "train.lr=0.01", "train.warmup_steps=0", "train.eval_every=2",
        "train.checkpoint_every=2", "eval.factors=[1,2]", "eval.buckets=2",
        "eval.max_tokens=0", "seeds=[0]", f"rows={ROWS}",
    ]  # fmt: skip
    cfg, mapping = resolve_config(LMConfig, PRESETS, "quick", [], sets)
    exp.run(cfg, mapping, tmp / "run")
    runs = {r.name: exp.run_dir(tmp / "run", r, 0) for r in cfg.rows}
    return runs | {"tmp": tmp, "sets": sets}


def _cli(argv, capsys):
    try:
        code = main(["generate", *argv])
    except SystemExit as e:  # argparse's usage errors (`cape` exits with its code)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_run_folder_holds_the_spec(runs):
    model, tok, spec = load_lm(runs["rotary"])
    assert spec["experiment"] == "lm" and spec["row"] == "rotary"
    assert spec["tokenizer"] == "bytes" and spec["context"] == 8
    assert not model.training and model.vocab_size == tok.vocab_size == 257
    assert readable_context(model) is None
    assert encode_prompt(tok, PROMPT) == [256, *PROMPT.encode()]


def test_greedy_is_generate_and_full_forwards(runs):
    model, tok, _ = load_lm(runs["rotary"])
    text, new, seconds = generate_text(model, tok, PROMPT, 12, stop_at_eod=False)
    assert (text, new) == generate_text(model, tok, PROMPT, 12, stop_at_eod=False)[:2]
    assert new == 12 and seconds > 0
    ids = [256, *PROMPT.encode()]
    ref = model.generate(torch.tensor([ids]), 12)[0].tolist()
    assert text == PROMPT + tok.decode(ref[len(ids) :])
    # independent of the cache and of `generate`: full forwards, argmax of the last row
    seq = list(ids)
    with torch.no_grad():
        for _ in range(5):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert ref[: len(seq)] == seq


def test_sampling_repeats_with_its_seed(runs):
    model, tok, _ = load_lm(runs["rotary"])

    def sample(seed, **kw):
        return generate_text(model, tok, PROMPT, 30, 1.0, seed=seed, stop_at_eod=False, **kw)[0]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    greedy = generate_text(model, tok, PROMPT, 30, stop_at_eod=False)[0]
    assert sample(3, top_k=1) == greedy  # one candidate: the argmax


def test_learned_table_reads_its_last_positions(runs):
    model, tok, _ = load_lm(runs["abspos"])
    assert readable_context(model) == 8
    ids = torch.tensor([encode_prompt(tok, "the earth was")])  # 14 tokens > 8
    out = generate_ids(model, ids, 4)[0].tolist()
    seq = ids[0].tolist()
    with torch.no_grad():
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq[-8:]]))[0, -1].argmax()))
    assert out == seq
    short = torch.tensor([encode_prompt(tok, "in")])  # 3 + 5 tokens: inside the table
    assert generate_ids(model, short, 5).tolist() == model.generate(short, 5).tolist()


def test_stops_at_the_end_of_the_document(runs):
    model, tok, _ = load_lm(runs["rotary"])
    with torch.no_grad():  # every final state is all ones, and <eod>'s row is all tens
        model.stack.norm.weight.zero_()
        model.stack.norm.bias.fill_(1.0)
        model.embed.weight[256] = 10.0
    text, new, _ = generate_text(model, tok, PROMPT, 10)
    assert (text, new) == (PROMPT, 0)
    assert generate_text(model, tok, PROMPT, 10, stop_at_eod=False)[1] == 10


def test_a_run_without_model_json_is_migrated_by_the_script(runs, capsys, migrate_runs):
    """The lab reads model.json only; scripts/migrate_runs.py writes it from config.json (the
    model `cape eval lm` builds), the same as the experiment's."""
    old = runs["tmp"] / "old"
    shutil.copytree(runs["rotary"], old)
    (old / "model.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no model.json"):
        load_lm(old)
    assert migrate_runs.main([str(old)]) == 0
    assert "model.json written from config.json" in capsys.readouterr().out
    model, tok, spec = load_lm(old)
    fresh, _, ref = load_lm(runs["rotary"])
    assert spec == {k: ref[k] for k in spec} and spec["row"] == "rotary"
    assert generate_text(model, tok, PROMPT, 8)[:2] == generate_text(fresh, tok, PROMPT, 8)[:2]
    assert migrate_runs.main([str(old)]) == 0  # a current folder: nothing to do
    assert "nothing to do" in capsys.readouterr().out
    # a config.json without its row is named
    (old / "model.json").unlink()
    record = json.loads((old / "config.json").read_text())
    record["experiment"].pop("row")
    (old / "config.json").write_text(json.dumps(record))
    assert migrate_runs.main([str(old)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err and '"row"' in err, err


def test_command_prints_text_then_rate(runs, capsys, monkeypatch):
    run = str(runs["rotary"])
    code, out, err = _cli([run, "--prompt", PROMPT, "--max-new", "10", "--ignore-eod"], capsys)
    assert code == 0 and out.startswith(PROMPT)
    model, tok, _ = load_lm(run)
    assert out == generate_text(model, tok, PROMPT, 10, stop_at_eod=False)[0] + "\n"
    assert err.count("\n") == 1 and "10 tokens generated" in err and "tokens/s" in err
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT + "\n"))
    assert _cli([run, "--prompt", "-", "--max-new", "10", "--ignore-eod"], capsys)[1] == out
    code, out, err = _cli(
        [str(runs["abspos"]), "--prompt", "the earth was", "--max-new", "3"], capsys
    )
    assert code == 0 and out.startswith("the earth was")
    assert "reads 8 positions" in err and "tokens/s" in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-new", "0"], "--max-new"),
        (["--max-new", "-3"], "--max-new"),
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-k", "0"], "--top-k"),
        (["--top-k", "1000"], "--top-k"),
        (["--checkpoint", "nope"], "nope"),
        (["--max-new", str(2**70)], "--max-new"),
        (["--max-new", str(2**24 + 1)], "--max-new"),
        (["--temperature", "1e400"], "--temperature"),
        (["--temperature", "inf"], "--temperature"),
        (["--top-k", str(2**70)], "--top-k"),
        (["--seed", "1180591620717411303424"], "--seed"),
        (["--seed", str(-(2**63) - 1)], "--seed"),
        (["--device", "meta"], "--device"),
        (["--device", "xpu"], "--device"),
        (["--device", "nonsense"], "--device"),
        (["--prompt", "ab\udcffc"], "--prompt"),  # argv bytes that are not UTF-8
    ],
)
def test_bad_flags_exit_2_naming_them(runs, capsys, argv, flag):
    code, out, err = _cli([str(runs["rotary"]), "--prompt", "x", *argv], capsys)
    assert code == 2 and not out
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_folders_that_are_not_runs_exit_2_naming_them(runs, capsys):
    tmp = runs["tmp"]
    for folder, words in (
        (tmp / "missing", ["does not exist"]),
        (tmp / "txt", ["no model.json"]),
        (runs["rotary YaRN"], ["'rotary'", "train_as"]),
    ):
        code, out, err = _cli([str(folder)], capsys)
        assert code == 2 and not out and err.count("\n") == 1, err
        assert str(folder) in err and all(w in err for w in words), err


def test_damaged_checkpoint_exits_1(runs, capsys):
    run = runs["tmp"] / "damaged"
    shutil.copytree(runs["rotary"], run)
    step = sorted((run / "checkpoints").glob("step_*"))[-1]
    for weights in step.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    code, out, err = _cli([str(run), "--checkpoint", step.name], capsys)
    assert code == 1 and not out and err.count("\n") == 1 and step.name in err, err


def test_a_prompt_on_stdin_that_is_not_utf8_is_named(runs, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"in \xffthe\n")))
    code, out, err = _cli([str(runs["rotary"]), "--prompt", "-"], capsys)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert "standard input must be UTF-8" in err and "byte 3" in err, err


def test_extreme_temperatures_generate(runs, capsys):
    # a denormal temperature is greedy decoding, a huge one samples uniformly: both work
    run = str(runs["rotary"])
    greedy = _cli([run, "--prompt", PROMPT, "--max-new", "6", "--ignore-eod"], capsys)
    tiny = _cli([run, "--prompt", PROMPT, "--max-new", "6", "--ignore-eod", "--temperature",
                 "1e-320"], capsys)  # fmt: skip
    assert tiny[0] == 0 and tiny[1] == greedy[1]
    code, out, _ = _cli([run, "--prompt", PROMPT, "--max-new", "6", "--temperature", "1e300"],
                        capsys)  # fmt: skip
    assert code == 0 and out.startswith(PROMPT)


def _edit_spec(run, change):
    spec = json.loads((run / "model.json").read_text())
    change(spec)
    (run / "model.json").write_text(json.dumps(spec))


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (lambda s: s["model"].update(dim=32), 1, ["does not describe the model of checkpoint"]),
        (lambda s: s["model"].update(layers=2), 1, ["does not describe", "stack.layers.1"]),
        (lambda s: s["model"].update(position="fire"), 1, ["does not describe", "Missing key"]),
        (lambda s: s["model"].update(bogus=1), 2, ['"model" has unknown keys', "bogus"]),
        (lambda s: s["model"].update(dim="16"), 2, ['"model": dim must be an int']),
        (lambda s: s["model"].pop("vocab_size"), 2, ["vocab_size"]),
        (lambda s: s.update(tokenizer=3), 2, ['"tokenizer" must be "bytes" or "bpe"']),
        (lambda s: s.update(model=[1]), 2, ['"model" object']),
    ],
)
def test_a_model_json_that_does_not_fit_is_named(runs, capsys, change, code, words):
    run = runs["tmp"] / f"spec{abs(hash(str(words))) % 10**8}"
    shutil.copytree(runs["rotary"], run)
    _edit_spec(run, change)
    got, out, err = _cli([str(run), "--max-new", "2"], capsys)
    assert got == code and not out and err.count("\n") == 1, err
    assert "model.json" in err and all(w in err for w in words) and "unexpected" not in err, err


def test_a_run_of_another_experiment_is_named(runs, capsys):
    run = runs["tmp"] / "other"
    shutil.copytree(runs["rotary"], run)
    _edit_spec(run, lambda s: s.update(experiment="translation"))
    code, out, err = _cli([str(run), "--max-new", "2"], capsys)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert str(run) in err and "is a 'translation' run, not an lm one" in err, err


@pytest.mark.parametrize("damage", ["truncated", "no checkpoints"])
def test_damaged_run_folders_are_named(runs, capsys, damage):
    run = runs["tmp"] / f"damaged-{damage.replace(' ', '-')}"
    shutil.copytree(runs["rotary"], run)
    if damage == "truncated":  # every weights file cut short: no intact checkpoint is left
        for weights in (run / "checkpoints").rglob("*.safetensors"):
            weights.write_bytes(weights.read_bytes()[:50])
        want, words = 1, ["damaged", "model.safetensors"]
    else:
        shutil.rmtree(run / "checkpoints")
        want, words = 2, ["no checkpoint in", "train it first"]
    code, out, err = _cli([str(run), "--max-new", "2"], capsys)
    assert code == want and not out and err.count("\n") == 1, err
    assert all(w in err for w in words) and "unexpected" not in err, err


@pytest.mark.parametrize("record", [True, False])
def test_training_again_with_another_model_is_named(runs, capsys, record):
    # `cape train lm` into a folder trained with model.dim 16, now 32: the study's
    # settings.json names the changed key; without it, resuming names the checkpoint
    out = runs["tmp"] / f"again-{record}"
    shutil.copytree(runs["tmp"] / "run", out)
    if not record:
        (out / "rotary" / "seed0" / "settings.json").unlink()
    sets = [a for s in [*runs["sets"], "model.dim=32"] for a in ("--set", s)]
    argv = ["train", "lm", "--preset", "quick", *sets, "--row", "rotary", "--out", str(out)]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unexpected" not in err, err
    words = ["model.dim: 16 -> 32"] if record else ["holds the weights of another model"]
    assert all(w in err for w in [*words, "another --out folder"]), err
