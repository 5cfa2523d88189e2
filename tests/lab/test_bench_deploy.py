"""`cape bench deploy`: its table, its cases, its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

import cape
from cape.lab.bench.deploy import main
from cape.lab.bench.deploy_cases import CASES, make_case


def test_every_build_name_has_a_case() -> None:
    # the page says "every cape.build name": a new encoding without a case fails here
    covered = {name.split()[0].split("+")[0] for name in CASES}
    assert set(cape.ENCODINGS) <= covered, sorted(set(cape.ENCODINGS) - covered)


def test_deploy_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deploy"
    assert main(["--cases", "sinpos,rotary", "--checks", "export", "--out", str(out)]) == 0
    table = (out / "deploy.md").read_text()
    rows = {r.split("|")[1].strip(): r.split("|")[2].strip() for r in table.splitlines()
            if r.startswith("| ") and not r.startswith("| case")}  # fmt: skip
    assert set(rows) == {"sinpos", "rotary"}
    assert all(float(v) < 1e-5 for v in rows.values())  # exported == eager on another shape
    assert (out / "deploy.csv").exists()


def test_a_failing_check_is_a_cell_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import cape.lab.bench.deploy as deploy

    def broken(case):
        raise RuntimeError("no such op\nmore")

    monkeypatch.setitem(deploy.CHECKS, "export", broken)
    assert main(["--cases", "nopos", "--checks", "export"]) == 1
    assert deploy.run_case("nopos", ["export"])["export"] == "fails: RuntimeError: no such op"


@pytest.mark.parametrize(("flag", "value"), [("--cases", "nope"), ("--checks", "onnx,x")])
def test_unknown_names_are_refused(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as err:
        main([flag, value])
    assert err.value.code == 2
    assert f"{flag} must be a comma list of" in capsys.readouterr().err


def test_cases_are_seeded() -> None:
    a, b = make_case("cape1d", seed=3), make_case("cape1d", seed=3)
    assert all(
        (p == q).all() for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True)
    )
