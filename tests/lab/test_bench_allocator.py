"""The allocator's state during `cape bench`: warm keeps large blocks off mmap, every table says
which state it was measured in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cape.lab.bench.allocator import allocator_state, mapped_bytes, set_allocator

PROBE = """
import torch
from cape.lab.bench.allocator import mapped_bytes, set_allocator
state = set_allocator({state!r})
before = mapped_bytes()                   # blocks mapped while importing, before the state
x = torch.empty(64 * 2**20 // 4)          # 64 MB: above glibc's largest mmap threshold
x.fill_(1.0)
print(state, mapped_bytes() - before)
"""


@pytest.mark.parametrize("state", ["warm", "cold"])
def test_warm_serves_large_tensors_from_the_heap(state: str) -> None:
    # a fresh process each: warm cannot be undone within one
    if mapped_bytes() is None:
        pytest.skip("needs glibc >= 2.33 (mallinfo2) to see mapped blocks")
    run = subprocess.run([sys.executable, "-c", PROBE.format(state=state)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    said, mapped = run.stdout.rsplit(maxsplit=1)
    if state == "warm":
        assert said.startswith("warm") and int(mapped) < 2**20  # not mmap-ed: reused on free
    else:
        assert said.startswith("cold") and int(mapped) >= 64 * 2**20  # mapped, unmapped on free


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="allocator must be one of warm, cold"):
        set_allocator("hot")


def test_tables_name_the_state(tmp_path, capsys) -> None:
    from cape.lab.cli import main

    rc = main(["bench", "--allocator", "cold", "deploy", "--cases", "nopos", "--checks", "export",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    assert f"- allocator: {allocator_state()}" in (tmp_path / "deploy.md").read_text()
    assert allocator_state().startswith("cold")
    with pytest.raises(SystemExit) as err:
        main(["bench", "--allocator", "hot", "deploy"])
    assert err.value.code == 2
