"""`cape demo`: build every encoding, check its defining property, plot position similarities.

A first look for a new user (the vision experiment will replace it as the main job): each
encoding is built through `cape.build`, run on a small batch, and one property of it is
measured; a PNG shows the dot-product similarity of the centre patch of a 14 x 14 grid to every
other patch, per encoding (the LFF paper's Figure 2).
"""

from __future__ import annotations

from pathlib import Path

import torch

from cape import functional as F
from cape.build import build
from cape.lab.arguments import ArgumentParser, check_out_folder
from cape.positions import grid_indices, grid_positions

GRID = 14


def _properties() -> list[tuple[str, str, str]]:
    rows = []

    def add(name: str, out: torch.Tensor, prop: str) -> None:
        rows.append((name, str(tuple(out.shape)), prop))

    x = torch.randn(4, 50, 64)
    sin = build("sinpos", 64).eval()
    e = sin(positions=torch.arange(0, 300.0).reshape(1, -1))[0]
    dots = torch.stack([(e[n] * e[n + 7]).sum() for n in range(0, 200, 13)])
    add("sinpos", sin(x), f"E(n).E(n+7) spread over n: {float(dots.std()):.1e}")
    cape = build("cape1d", 64, preset="text").train()
    a, b = cape(x), cape(x)
    add("cape1d (text)", a, f"two train calls differ by {float((a - b).abs().max()):.2f}")
    c2 = build("cape2d", 64, preset="image").eval()
    emb = {r: c2(grid=(r, r)) for r in (8, 14, 24)}
    same = bool(torch.allclose(emb[8][0, 0], emb[24][0, 0], atol=1e-5))
    add("cape2d (image)", emb[14], f"corner embedding same at 8/14/24 px grids: {same}")
    lff = build("lff", 64, pos_dim=2, mlp=False, fourier_dim=64, gamma=0.5)
    r = lff(positions=torch.tensor([[[0.0, 0.0], [0.3, 0.4]]]))[0].detach()
    dot, kernel = float(r[0] @ r[1]), float(F.lff_kernel(torch.tensor(0.25), 0.5))
    add("lff (no MLP)", r, f"r_x.r_y = {dot:.3f}, kernel {kernel:.3f} (F=64 Monte Carlo)")
    ab = build("abspos", 64, num_positions=20)
    out = ab(positions=torch.arange(0, 45.0).reshape(1, -1))[0]
    add("abspos", ab(x), f"E(25) == E(5) (mod-20 rule): {bool(torch.equal(out[25], out[5]))}")
    rel = build("relpos", 16, max_distance=4)
    q = torch.randn(2, 2, 10, 16)
    add("relpos", rel(q, q, q), "clipped distances |j-i| <= 4 inside attention")
    qr, _ = build("rotary", 16)(q, q)
    add("rotary", qr, f"norm kept: {torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-4)}")
    add("nopos", build("nopos", 64)(x), "zeros")
    return rows


def similarity_maps(dim: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Centre-patch similarity maps [GRID, GRID] per encoding (cosine of embeddings)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    grid = grid_positions(GRID, GRID, batch=1)
    ij = grid_indices(GRID, GRID, batch=1)
    embs = {
        "sinpos2d": build("sinpos2d", dim).eval()(grid=(GRID, GRID)),
        "CAPE2d (one train draw)": build("cape2d", dim, preset="image").train()(
            grid=(GRID, GRID), generator=gen
        ),
        "Sine-2D": build("sine-2d", dim)(positions=ij.float()),
        # the MLP's bias dominates at init: show the Fourier features, whose dot product is a
        # Gaussian kernel of the distance (cape.functional.lff_kernel)
        "LFF Fourier features (init)": build(
            "lff", dim, pos_dim=2, mlp=False, fourier_dim=dim, gamma=0.5
        )(positions=grid).detach(),
        "Embed-2D (init)": build("embed-2d", dim, sizes=(GRID, GRID))(positions=ij),
    }
    centre = (GRID // 2) * GRID + GRID // 2
    out = {}
    for name, e in embs.items():
        e = torch.nn.functional.normalize(e[0].detach().float(), dim=-1)
        out[name] = (e @ e[centre]).reshape(GRID, GRID)
    return out


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="cape demo", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="folder for the plot")
    args = p.parse_args(argv)
    check_out_folder(args.out, "--out")
    print("| encoding | output shape | property |\n|---|---|---|")
    for name, shape, prop in _properties():
        print(f"| {name} | {shape} | {prop} |")
    try:
        from cape.lab.viz import plot_maps

        path = plot_maps(
            {"": similarity_maps()},
            args.out / "similarity.png",
            vmin=-1.0,
            vmax=1.0,
            title=f"cosine similarity of the centre patch to every patch ({GRID} x {GRID} grid)",
        )
        print(f"plot: {path}")
    except ImportError:
        print("matplotlib is not installed: pip install 'cape[plot]' for the plot")
    return 0
