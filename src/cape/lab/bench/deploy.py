"""What works with torch.export, ONNX and torch.compile: `cape bench deploy`.

For every case of `deploy_cases.CASES` (each `cape.build` name in the model that uses it, and
every model), four checks, each a cell of deploy.md / deploy.csv:

- export: `torch.export.export(strict=False)` in eval mode with the batch and the length (or the
  image's size) dynamic; the exported program, run on inputs of another shape, against eager.
- onnx: `torch.onnx.export(dynamo=True)` with the same dynamic shapes; onnxruntime on the inputs
  of another shape against eager (needs onnx, onnxscript, onnxruntime).
- compile eval: `torch.compile(fullgraph=True, dynamic=True)` (a graph break is an error) on
  both shapes against eager.
- compile train: the same in training mode (CAPE's draws inside the graph), forward and
  backward on both shapes: finite loss and gradients.

A cell holds the largest |difference| to eager (or "ok"), or "fails: <the error's first line>".
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.deploy_cases import CASES, Case, make_case
from cape.lab.bench.results import machine, write_results

__all__ = ["CHECKS", "check_export", "check_onnx", "check_compile", "run_case", "main"]


def _error(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"fails: {type(err).__name__}: {lines[0][:160] if lines else ''}"


def _diff(a: Any, b: Any) -> float:
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    return float((torch.as_tensor(a).float() - b.float()).abs().max())


def check_export(case: Case) -> str:
    module = case.module.eval()
    program = torch.export.export(module, case.args, dynamic_shapes=case.dynamic, strict=False)
    with torch.no_grad():
        return f"{_diff(program.module()(*case.other), module(*case.other)):.1e}"


def check_onnx(case: Case) -> str:
    try:
        import onnxruntime
    except ImportError:
        return "not run: onnxruntime is not installed"
    module = case.module.eval()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = str(Path(tmp) / "model.onnx")
        program = torch.onnx.export(
            module, case.args, dynamo=True, dynamic_shapes=case.dynamic, verbose=False
        )
        program.save(path)
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        out = session.run(None, {n: t.numpy() for n, t in zip(names, case.other, strict=True)})
    with torch.no_grad():
        return f"{_diff(torch.from_numpy(out[0]), module(*case.other)):.1e}"


def check_compile(case: Case, train: bool) -> str:
    torch._dynamo.reset()
    module = case.module.train(train)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    if not train:
        with torch.no_grad():
            worst = max(_diff(compiled(*a), module(*a)) for a in (case.args, case.other))
        return f"{worst:.1e}"
    for given in (case.args, case.other):
        module.zero_grad()
        # gradients to the float inputs too: an encoding without parameters (sine-Nd) has some
        inputs = [a.detach().requires_grad_() if a.is_floating_point() else a for a in given]
        loss = case.loss(compiled(*inputs))
        loss.backward()
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        grads += [a.grad for a in inputs if a.grad is not None]
        if not torch.isfinite(loss) or not all(torch.isfinite(g).all() for g in grads):
            return "fails: non-finite loss or gradients"
    return "ok"


CHECKS = {
    "export": check_export,
    "onnx": check_onnx,
    "compile eval": lambda case: check_compile(case, train=False),
    "compile train": lambda case: check_compile(case, train=True),
}


def run_case(name: str, checks: list[str]) -> dict[str, Any]:
    """One row: the case `name` through each of `checks` (a fresh case per check)."""
    row: dict[str, Any] = {"case": name}
    for check in checks:
        try:
            row[check] = CHECKS[check](make_case(name))
        except ModuleNotFoundError as err:  # an optional library the case needs (timm)
            row[check] = f"not run: {err.name} is not installed"
        except Exception as err:  # a cell of the table: what failed, not a crash of the bench
            row[check] = _error(err)
    return row


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="cape bench deploy", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--cases", default=",".join(CASES), help="comma list of cases (default: all)")
    p.add_argument("--checks", default=",".join(CHECKS), help="comma list: " + ", ".join(CHECKS))
    p.add_argument("--out", type=out_folder, default=None, help="folder for deploy.md / .csv")
    args = p.parse_args(argv)
    cases = p.names("--cases", args.cases, list(CASES))
    checks = p.names("--checks", args.checks, list(CHECKS))
    rows = []
    for name in cases:
        rows.append(run_case(name, checks))
        print(" | ".join(str(v) for v in rows[-1].values()), flush=True)
    notes = (
        "Cells: the largest |output - eager| on inputs of another batch and length (or image "
        "size), 'ok' (training: finite loss and gradients on both shapes), or why it fails."
    )
    write_results(
        args.out, "deploy", rows, title="Compile, export, ONNX", meta=machine(), notes=notes
    )
    return 0 if all(not str(v).startswith("fails") for r in rows for v in r.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
