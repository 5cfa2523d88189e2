"""Outputs of every model whose method must not change, saved to compare two versions of cape.

Run once with each version on PYTHONPATH (e.g. a worktree of the earlier commit), same threads:

    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/before/src python scripts/model_outputs.py before.pt
    OMP_NUM_THREADS=1 PYTHONPATH=src python scripts/model_outputs.py after.pt
    python scripts/model_outputs.py --compare before.pt after.pt

Covers CTCModel, Seq2Seq (8 encodings each), ViT (6), causal stacks: train and eval outputs and
gradients; the length experiment's rows (a train-mode forward) and the boxes models' initial
weights. The lab's module paths are those of this version (`length.model`, `lff_boxes.model`).
"""

import sys

import torch

import cape
from cape.models import CTCModel, Seq2Seq, TransformerEncoder, ViT


def _run(out, name, make, call):
    torch.manual_seed(0)
    m = make()
    for mode in ("train", "eval"):
        m.train(mode == "train")
        torch.manual_seed(1)
        y = call(m)
        y = y[0] if isinstance(y, tuple) else y
        out[f"{name}/{mode}"] = y.detach().clone()
        if mode == "train":
            y.float().square().mean().backward()
            grads = [p.grad.flatten() for p in m.parameters() if p.grad is not None]
            out[f"{name}/grad"] = torch.cat(grads)


def library_outputs(out):
    torch.manual_seed(123)
    feats, lens = torch.randn(3, 40, 16), torch.tensor([40, 31, 12])
    names = ["nopos", "sinpos", "cape1d", "relpos", "rotary", "alibi", "fire", "abspos"]
    for pos in names:
        _run(out, f"ctc-{pos}", lambda pos=pos: CTCModel.small(12, position=pos, n_mels=16, depth=2,
             dim=32, heads=4, ffn_dim=64), lambda m: m(feats, lens))  # fmt: skip
    src = torch.randint(1, 50, (3, 9))
    sm = cape.lengths_to_mask(torch.tensor([9, 6, 3]), 9)
    tgt = torch.randint(1, 50, (3, 7))
    tm = cape.lengths_to_mask(torch.tensor([7, 5, 2]), 7)
    for pos in names:
        _run(out, f"s2s-{pos}", lambda pos=pos: Seq2Seq(50, dim=32, heads=4, ffn_dim=64,
             position=pos), lambda m: m(src, sm, tgt, tm))  # fmt: skip
    img = torch.randn(2, 3, 16, 16)
    vit = [("nopos", {}), ("cape2d", {"preset": "image"}), ("rotary2d", {"fit_grid": True}),
           ("rope-mixed", {}), ("rope-axial", {}), ("abspos2d", {})]  # fmt: skip
    for pos, opts in vit:
        _run(out, f"vit-{pos}", lambda pos=pos, opts=opts: ViT(4, image_size=16, patch=4,
             dim=32, depth=2, heads=2, position=pos, position_options=opts),
             lambda m: m(img))  # fmt: skip
    x = torch.randn(2, 10, 32)
    _run(out, "enc-causal", lambda: TransformerEncoder(2, 32, 4, 64, causal=True), lambda m: m(x))
    _run(out, "enc-causal-rotary", lambda: TransformerEncoder(2, 32, 4, 64, causal=True,
         relative_factory=lambda: cape.Rotary(8)), lambda m: m(x))  # fmt: skip
    causal_lm_outputs(out)


def causal_lm_outputs(out):
    """CausalLM: train/eval logits and gradients, and greedy decoding through the cache."""
    from cape.models import CausalLM

    tokens = torch.randint(0, 40, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    aug = {"augmentation": {"max_global_shift": 5.0, "max_local_shift": 0.5,
                            "max_global_scaling": 1.5}}  # fmt: skip
    rows = [("rotary", {}), ("rotary", aug), ("rotary", {"xpos": True}),
            ("rotary", {"scaling": "yarn", "factor": 2.0, "train_length": 8}),
            ("rotary", {"scaling": "ntk", "train_length": 6}), ("alibi", {}), ("alibi", aug),
            ("fire", {}), ("relpos", {}), ("cape1d", {}),
            ("rotary", {**aug, "draw": "per_layer"})]  # fmt: skip
    for i, (pos, opts) in enumerate(rows):
        name = f"lm{i}-{pos}"
        _run(out, name, lambda pos=pos, opts=opts: CausalLM(40, dim=32, layers=2, heads=4,
             ffn_dim=64, dropout=0.0, position=pos, position_options=opts),
             lambda m: m(tokens, mask))  # fmt: skip
        torch.manual_seed(0)
        m = CausalLM(40, dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.0, position=pos,
                     position_options=opts).eval()  # fmt: skip
        out[f"{name}/generate"] = m.generate(tokens[:, :5], 6)


def lab_outputs(out):
    from cape.lab.experiments.length.config import PRESETS as LP
    from cape.lab.experiments.length.config import LengthConfig
    from cape.lab.experiments.length.model import make_model as length_model
    from cape.lab.experiments.lff_boxes.config import PRESETS as BP
    from cape.lab.experiments.lff_boxes.config import LffBoxesConfig
    from cape.lab.experiments.lff_boxes.model import make_model as box_model
    from cape.lab.experiments.study_config import resolve_config

    cfg, _ = resolve_config(LengthConfig, LP, "cpu-full")
    torch.manual_seed(7)
    tokens = torch.randint(0, cfg.data.vocab, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.bool)
    mask[1, 15:] = False
    for row in cfg.rows:
        if row.train_as:
            continue
        torch.manual_seed(0)
        m = length_model(cfg, row).train()
        torch.manual_seed(1)
        out["len/" + row.name] = m({"tokens": tokens, "mask": mask}).detach()
    bcfg, _ = resolve_config(LffBoxesConfig, BP, "peers")
    for row in bcfg.rows:
        torch.manual_seed(0)
        m = box_model(bcfg, row)
        out["box/" + row.name] = torch.cat([p.detach().flatten() for p in m.parameters()])


def main() -> int:
    if sys.argv[1] == "--compare":
        a, b = (torch.load(f) for f in sys.argv[2:4])
        differ = [
            k for k in a if k not in b or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])
        ]
        print(f"{len(a)} outputs; differ: {differ or 'none'}")
        return 1 if differ else 0
    out: dict = {}
    library_outputs(out)
    lab_outputs(out)
    torch.save(out, sys.argv[1])
    print(len(out), "outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
