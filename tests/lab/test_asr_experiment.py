"""The speech experiment: config checks, batches, the CTC loss feed, decoding, per-bin WER, the
report, and a tiny end-to-end run on a synthesised corpus (resumed from its cached results)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cape.lab.data.speech.synth import DURATION_BINS
from cape.lab.data.speech.tokens import decode as decode_ids
from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.asr import evaluate as E
from cape.lab.experiments.asr import evaluate as asr_eval
from cape.lab.experiments.asr.config import AsrConfig
from cape.lab.experiments.asr.data import Utterance, collate_fn
from cape.lab.experiments.asr.experiment import ASR as A
from cape.lab.experiments.asr.model import ctc_loss_fn
from cape.lab.experiments.asr.report import bin_table, flatness
from cape.lab.metrics import wer

TINY_MODEL = {"dim": 32, "depth": 1, "heads": 2, "ffn_dim": 64}


def _cfg(*overrides: str, preset: str = "quick") -> AsrConfig:
    exp = EXPERIMENTS["asr"]
    return resolve_config(exp.config_cls, exp.presets, preset, [], list(overrides))[0]


def _utt(seconds: float, text: str = "hello world", seed: int = 0) -> Utterance:
    g = torch.Generator().manual_seed(seed)
    wave = (torch.randn(int(seconds * 16000), generator=g) * 3000).to(torch.int16).numpy()
    return Utterance(wave, text, seconds, None, f"u{seed}")


@pytest.mark.parametrize(
    "preset", ["digits-k3-small", "quick", "digits", "digits-k3", "cpu-full", "paper"]
)
def test_presets_resolve(preset: str) -> None:
    cfg = _cfg(preset=preset)
    assert cfg.rows and cfg.train.best_metric == "wer"
    names = [r.name for r in cfg.rows]
    assert {"sinpos", "CAPE", "nopos"} <= set(names)
    assert preset == "digits-k3-small" or "abspos" in names
    assert set(cfg.eval.hop_rows) <= set(names)


def test_the_default_is_a_question_positions_decide():
    """Issue 43: the default's frames do not see their neighbours (kernel = stride), it runs the
    rows that carry the point, each seeded twice."""
    assert A.default_preset == "digits-k3-small"
    cfg = _cfg(preset=A.default_preset)
    assert cfg.name == "asr-digits-k3-small" and cfg.data.text == "digits"
    assert cfg.model.kernel == cfg.model.stride == 3
    names = {r.name for r in cfg.rows}
    assert {"nopos", "sinpos", "CAPE", "rotary", "rotary+CAPE", "ALiBi"} <= names
    assert len(cfg.seeds) >= 2


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('rows=[{"name": "x", "position": "wavelet"}]', "rows[x].position"),
        ('rows=[{"name": "x", "position": "sinpos", "batching": "packed"}]', "rows[x].batching"),
        ("eval.hop_rows=[nobody]", "eval.hop_rows"),
        ("train.best_metric=loss", "train.best_metric"),
        ("features.time_ratio=1.5", "features.time_ratio"),
        ("model.heads=5", "model.dim"),
        ("eval.splits=[train]", "eval.splits"),
        ("data.text=klingon", "data.text must be one of"),
    ],
)
def test_bad_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        _cfg(override)


def test_collate_padded_and_padding_free() -> None:
    cfg = _cfg()
    items = [_utt(1.0, "a b", 0), _utt(1.5, "cd", 1), _utt(1.2, "e", 2)]
    padded = collate_fn(cfg.features, "padded")(items)
    assert padded["features"].shape == (3, 1 + (24000 - 400) // 160, 80)
    assert padded["lengths"].tolist() == [1 + (n - 400) // 160 for n in (16000, 24000, 19200)]
    assert decode_ids(padded["targets"][:3]) == "a b"
    assert padded["target_lengths"].tolist() == [3, 2, 1]
    torch.manual_seed(0)
    free = collate_fn(cfg.features, "padding-free")(items)
    frames = free["features"].shape[1]
    assert free["lengths"].tolist() == [frames] * 3  # no padding at all
    # every sample spans its whole audio: its last kept frame lies near its end
    last = free["frame_times"][:, -1]
    for t, u in zip(last.tolist(), items, strict=True):
        assert u.duration - 0.05 < t + 0.0125 < u.duration + 0.05
    assert (free["hop"] > 0.008).all() and not torch.allclose(free["hop"], free["hop"][:1])


class _Spy(torch.nn.Module):
    """Records how the loss calls the model; outputs uniform log-probs of 29 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.calls: list[dict] = []

    def forward(self, feats, lengths, **kw):
        self.calls.append(kw)
        steps = (feats.shape[1] + 2) // 3
        out = torch.full((feats.shape[0], steps, 29), -math.log(29.0)) + 0 * self.w
        return out, (lengths + 2) // 3


@pytest.mark.parametrize("batching", ["padded", "padding-free"])
def test_loss_feeds_hops_or_frame_times_and_is_ctc(batching: str) -> None:
    cfg = _cfg()
    row = next(r for r in cfg.rows if r.name == "CAPE")
    row.batching, row.specaugment = batching, False
    batch = collate_fn(cfg.features, batching)([_utt(1.0, "ab", 0), _utt(1.3, "c", 1)])
    spy = _Spy()
    loss, _ = ctc_loss_fn(cfg.features, row)(spy, batch)
    assert set(spy.calls[0]) == ({"frame_times"} if batching == "padding-free" else {"hop"})
    # independent: CTC of uniform scores is -log(#paths) + T log 29, via torch's own ctc_loss
    lp, ol = spy(batch["features"], batch["lengths"])
    ref = torch.nn.functional.ctc_loss(
        lp.transpose(0, 1), batch["targets"], ol, batch["target_lengths"], reduction="none"
    )
    torch.testing.assert_close(loss, (ref / batch["target_lengths"]).mean())


def test_batched_decoding_equals_one_at_a_time() -> None:
    cfg = _cfg(*(f"model.{k}={v}" for k, v in TINY_MODEL.items()))
    torch.manual_seed(0)
    model = A.make_model(cfg, cfg.rows[3]).eval()
    with torch.no_grad():
        model.head.bias.copy_(torch.linspace(-1, 1, 29))  # avoid an all-blank output
    utts = [_utt(s, seed=i) for i, s in enumerate((0.7, 2.0, 1.1, 3.3))]
    one, _ = asr_eval.decode(model, utts, cfg.features, batch_size=1)
    many, _ = asr_eval.decode(model, utts, cfg.features, batch_size=3)
    assert one == many and any(one)


def test_bin_records_match_independent_wer() -> None:
    utts = [
        _utt(d, text, i)
        for i, (d, text) in enumerate([(2.0, "a b c"), (5.0, "d e"), (7.0, "f g h i"), (31.0, "j")])
    ]
    hyps = ["a x c", "d e", "f g", ""]
    recs = E._bin_records(utts, hyps, {"row": "r"})
    by = {r["bin"]: r for r in recs}
    assert list(by) == [f"{lo:02d}-{hi:02d}" for lo, hi in DURATION_BINS] + ["all"]
    assert by["00-06"]["wer"] == pytest.approx(100 * wer(["a b c", "d e"], hyps[:2]))
    assert by["06-10"]["wer"] == pytest.approx(50.0)
    assert by["30-45"]["wer"] == pytest.approx(100.0)
    assert by["all"]["wer"] == pytest.approx(100 * wer([u.text for u in utts], hyps))
    assert by["10-15"]["utterances"] == 0 and math.isnan(by["10-15"]["wer"])


def test_removed_records_take_every_position_out_and_put_them_back(monkeypatch) -> None:
    """The study's positions-removed check (`Experiment.measure_removed`): decoding sees no
    encoding of any kind, the model gets its own back, the records join the run's."""
    from types import SimpleNamespace

    cfg = _cfg(*(f"model.{k}={v}" for k, v in TINY_MODEL.items()), preset="digits-k3-small")
    seen = []

    def spy(model, utts, features, **kw):  # what decode sees: no encoding of any kind
        attn = [m for m in model.modules() if hasattr(m, "rotary")]
        seen.append((model.encoder.position, [(a.rotary, len(a.biases)) for a in attn]))
        return ["a"] * len(utts), 0.0

    monkeypatch.setattr(E, "decode", spy)
    data = type("D", (), {"test": lambda self, split: [_utt(2.0, "a", 0)]})()
    study = SimpleNamespace(cfg=cfg, data=data)
    for name in ("sinpos", "rotary", "ALiBi"):
        row = next(r for r in cfg.rows if r.name == name)
        model = A.make_model(cfg, row).eval()
        before = repr(model), model.encoder.position
        seen.clear()
        done = {"records": [{"split": "test"}]}
        A.measure_removed(study, row, 0, model, done)
        position, attn = seen[0]
        assert position is None and all(r is None and n == 0 for r, n in attn), name
        assert (repr(model), model.encoder.position) == before  # put back
        recs = done["records"][1:]
        assert done["records"][0] == {"split": "test"} and "removed" not in done
        assert {r["split"] for r in recs} == {"test, positions removed"} and recs[-1]["wer"] == 0.0
    nopos = next(r for r in cfg.rows if r.name == "nopos")
    done = {"records": []}
    A.measure_removed(study, nopos, 0, A.make_model(cfg, nopos), done)
    assert done == {"records": []} and not seen[1:]


def test_flatness_is_longest_over_shortest_mean() -> None:
    recs = [
        {"row": "a", "bin": "00-06", "wer": 10.0},
        {"row": "a", "bin": "00-06", "wer": 20.0},
        {"row": "a", "bin": "30-45", "wer": 45.0},
        {"row": "b", "bin": "00-06", "wer": 8.0},
        {"row": "b", "bin": "30-45", "wer": 8.0},
    ]
    assert flatness(recs) == {"a": pytest.approx(3.0), "b": pytest.approx(1.0)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from cape.lab.data.speech.espeak import espeak_available

    if not espeak_available():
        pytest.skip("libespeak-ng is not installed")
    pytest.importorskip("soundfile")
    root = tmp_path_factory.mktemp("asr")
    sets = [
        f"data.root={root / 'corpus'}",
        "data.train=24",
        "data.val=4",
        "data.test_per_bin=1",
        "data.workers=1",
        "train.steps=3",
        "train.batch_size=8",
        "train.eval_every=3",
        "train.checkpoint_every=3",
        "train.warmup_steps=1",
        "eval.hops_ms=[10, 20]",
        'rows=[{"name": "CAPE", "position": "cape1d"}, {"name": "sinpos pf", '
        '"position": "sinpos", "batching": "padding-free"}]',
        "eval.hop_rows=[CAPE]",
        *(f"model.{k}={v}" for k, v in TINY_MODEL.items()),
    ]
    exp = EXPERIMENTS["asr"]
    cfg, mapping = resolve_config(exp.config_cls, exp.presets, "quick", [], sets)
    out = root / "run"
    results = A.run(cfg, mapping, out)
    return cfg, mapping, out, results


def test_tiny_experiment_writes_report_and_resumes(tiny_run) -> None:
    cfg, mapping, out, results = tiny_run
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "WER (%) per test duration bin" in report and "sinpos pf" in report
    splits = {(r["row"], r["split"]) for r in results["records"]}
    assert ("CAPE", "test@hop") in splits and ("sinpos pf", "test@hop") not in splits
    hops = {r["hop_ms"] for r in results["records"] if r["split"] == "test@hop"}
    assert hops == {10.0, 20.0}
    assert bin_table(results, "test").count("\n") == 3  # header, rule, two rows
    removed = {r["row"] for r in results["records"] if r["split"] == "test, positions removed"}
    assert removed == {"CAPE", "sinpos pf"} and "Does the model use its positions" in report
    spec = json.loads((out / "cape" / "seed0" / "model.json").read_text())
    assert spec["model"]["position"] == "cape1d" and spec["features"]["hop_ms"] == 10.0
    mtime = (out / "cape" / "seed0" / "eval.json").stat().st_mtime
    again = A.run(cfg, mapping, out)  # cached: nothing is trained or evaluated again
    assert (out / "cape" / "seed0" / "eval.json").stat().st_mtime == mtime
    assert again["records"] == json.loads(json.dumps(results["records"]))
    assert A.redraw(out) == out / "report.md"


def _report_archived_run(tiny_run, tmp_path, row, mapping_row, rename=False):
    """Report `row` from a run folder restored from results/ (eval.json + settings.json, no
    checkpoints) holding the tiny run's CAPE records without the positions-removed ones; returns
    (records restored, the study's records, the run folder)."""
    import dataclasses

    from cape.lab.experiments.run_folders import run_dir, run_settings

    cfg, mapping, out, _ = tiny_run
    cfg2 = dataclasses.replace(cfg, rows=(row,), eval=dataclasses.replace(cfg.eval, hop_rows=()))
    mapping2 = {**mapping, "rows": [mapping_row], "eval": {**mapping["eval"], "hop_rows": []}}
    cached = json.loads((out / "cape" / "seed0" / "eval.json").read_text())
    records = [
        {**r, "row": row.name} if rename else r
        for r in cached["records"]
        if r["split"] not in ("test, positions removed", "test@hop")
    ]
    assert len(records) < len(cached["records"])  # the tiny run did measure it, with weights
    folder = run_dir(tmp_path, row, 0)
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(
        json.dumps({"records": records, "summary": cached["summary"]})
    )
    (folder / "settings.json").write_text(json.dumps(run_settings(cfg2, row)))
    results = A.run(cfg2, mapping2, tmp_path)
    assert (tmp_path / "report.md").is_file()
    return records, results["records"], folder


def test_archived_run_of_a_row_without_positions_needs_no_weights(tiny_run, tmp_path) -> None:
    # a row with no absolute encoding has no "positions removed" records, and needs none
    import dataclasses

    nopos = next(r for r in _cfg().rows if r.name == "nopos")
    row = dataclasses.asdict(nopos)  # as the config mapping writes it
    restored, got, folder = _report_archived_run(tiny_run, tmp_path, nopos, row, rename=True)
    assert got == restored and not (folder / "checkpoints").exists()


def test_archived_run_with_positions_keeps_its_records_without_weights(tiny_run, tmp_path):
    # a row with positions whose eval.json holds no positions-removed records and which has no
    # weights to measure them with: its records are reported as they are
    _, mapping, _, _ = tiny_run
    cape_row = next(r for r in tiny_run[0].rows if r.name == "CAPE")
    row = next(r for r in mapping["rows"] if r["name"] == "CAPE")
    restored, got, folder = _report_archived_run(tiny_run, tmp_path, cape_row, row)
    assert got == restored and not (folder / "checkpoints").exists()


def test_transcribe_a_trained_run(tiny_run, capsys) -> None:
    from cape.lab.cli import main

    _, _, out, _ = tiny_run
    wavs = sorted((Path(tiny_run[0].data.root) / "test").glob("*.wav"))[:2]
    assert main(["transcribe", str(out / "cape" / "seed0"), *map(str, wavs)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("\t" in line for line in lines)


@pytest.mark.slow
def test_experiment_under_torchrun_two_cpu_ranks(tmp_path) -> None:
    """`torchrun -m cape.lab experiment asr`: rank 0 makes the corpus while rank 1 waits, each rank
    trains on its share of the duration batches, validation counts are summed over ranks, and
    only rank 0 writes the report."""
    import os
    import subprocess
    import sys

    from cape.lab.data.speech.espeak import espeak_available

    if not espeak_available():
        pytest.skip("libespeak-ng is not installed")
    pytest.importorskip("soundfile")
    sets = [
        f"data.root={tmp_path / 'corpus'}",
        "data.train=16",
        "data.val=4",
        "data.test_per_bin=1",
        "data.workers=1",
        "train.steps=2",
        "train.batch_size=4",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.warmup_steps=1",
        "eval.splits=[test]",
        "eval.hop_rows=[]",
        'rows=[{"name": "CAPE pf", "position": "cape1d", "batching": "padding-free"}]',
        *(f"model.{k}={v}" for k, v in TINY_MODEL.items()),
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cape.lab",
        "experiment",
        "asr",
        "--out",
        str(tmp_path / "run"),
    ]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {r["split"] for r in results["records"]} == {"test", "test, positions removed"}
    summary = results["train"]["CAPE pf/seed0"]
    assert summary["step"] == 2.0 and 0.0 <= summary["eval_wer"] <= 100.0 * 4


def test_paper_claims_from_records() -> None:
    from cape.lab.experiments.asr.report import paper_claims

    # WER per bin (shortest, longest) -> ratio; the "all" bin is what the studies compare
    wer = {
        "CAPE": (10, 14, 12),
        "sinpos": (10, 25, 18),
        "abspos": (10, 18, 14),
        "CAPE no SpecAugment": (12, 16, 13),
        "sinpos padding-free": (10, 26, 17.5),
        "CAPE λ=1": (11, 12, 11.5),
        "CAPE λ=1 padding-free": (11, 13, 12.0),
    }
    records = [
        {"row": row, "seed": seed, "split": "test", "hop_ms": 10.0, "bin": b, "wer": w}
        for seed in (0, 1)
        for row, ws in wer.items()
        for b, w in zip(("00-06", "30-45", "all"), ws, strict=True)
    ]
    records.append(
        {"row": "CAPE", "seed": 0, "split": "test", "hop_ms": 20.0, "bin": "00-06", "wer": 99.0}
    )  # another hop: not counted
    for seed in (0, 1):  # positions removed: CAPE barely changes, sinpos much worse
        records.append(
            {
                "row": "CAPE",
                "seed": seed,
                "split": "test, positions removed",
                "hop_ms": 10.0,
                "bin": "all",
                "wer": 13.0,
            }
        )
        records.append(
            {
                "row": "sinpos",
                "seed": seed,
                "split": "test, positions removed",
                "hop_ms": 10.0,
                "bin": "all",
                "wer": 50.0 + seed,
            }
        )
    results = {"config": {"features": {"hop_ms": 10.0}}, "records": records}
    got = {claim: (measured, holds) for claim, measured, holds in paper_claims(results)}
    assert got["CAPE: longest-bin WER <= 1.5 x shortest"] == ("1.40", True)
    assert got["sinpos: longest-bin WER > 2 x shortest"] == ("2.50", True)
    assert got["abspos: longest-bin WER > 2 x shortest"] == ("1.80", False)
    assert got["CAPE + SpecAugment better than either alone"] == (
        "CAPE 12.0 ± 0.0, CAPE no SpecAugment 13.0 ± 0.0, sinpos 18.0 ± 0.0",
        True,
    )
    assert got["sinpos padding-free at least as good as padded"][1] is True
    assert got["CAPE uses its positions: WER > 2 points higher without them"] == (
        "12.0 -> 13.0",
        False,
    )
    assert got["sinpos uses its positions: WER > 2 points higher without them"] == (
        "18.0 -> 50.5",
        True,
    )
    assert got["CAPE λ=1 padding-free at least as good as padded"] == (
        "CAPE λ=1 padding-free 12.0 ± 0.0 vs CAPE λ=1 11.5 ± 0.0",
        False,
    )
    one_seed = {**results, "records": [r for r in records if r["seed"] == 0]}
    got = {claim: measured for claim, measured, _ in paper_claims(one_seed)}
    assert got["CAPE λ=1 padding-free at least as good as padded"] == (
        "CAPE λ=1 padding-free 12.0 vs CAPE λ=1 11.5"
    )  # one seed: no spread to show


def test_rows_option_keeps_the_row_lists_of_eval_consistent(capsys) -> None:
    import yaml

    from cape.lab.cli import main as cli

    assert (
        cli(
            [
                "experiment",
                "asr",
                "--preset",
                "digits-k3",
                "--rows",
                "CAPE no global shift,sinpos",
                "--print-config",
            ]
        )
        == 0
    )
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert [r["name"] for r in cfg["rows"]] == ["sinpos", "CAPE no global shift"]
    assert cfg["rows"][1]["options"] == {"max_global_shift": 0.0}
    assert cfg["eval"]["hop_rows"] == ["sinpos"]  # CAPE was not chosen
