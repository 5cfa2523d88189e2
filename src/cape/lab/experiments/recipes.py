"""Options a study sets from its training length L by an encoding's own recipe: FIRE's
threshold and xPos's scale base are lengths, and their papers chose them against the length
they trained on, so a study at another L scales them with it."""

from __future__ import annotations

from typing import Any

__all__ = ["FIRE_THRESHOLD_RATIO", "XPOS_SCALE_BASE_RATIO", "length_recipe", "recipe_notes"]

# FIRE's threshold over the training length in the authors' setting (their code's L = 512,
# their language models trained on 2048 tokens): below L, so that training sees queries past
# the threshold and the MLP learns the whole range of psi(d) / psi(max(threshold, i)) in [0, 1]
FIRE_THRESHOLD_RATIO = 0.25
# xPos's scale base over the training length in its paper (512 over 1024 tokens): its decay
# zeta^((n - m) / base) reaches the same strength at distance L as there
XPOS_SCALE_BASE_RATIO = 0.5


def length_recipe(position: str, options: dict[str, Any], *, train_length: float) -> dict[str, Any]:
    """`options` with FIRE's `threshold` at L / 4 and xPos's `xpos_scale_base` at L / 2
    (L = `train_length`, in the units of the positions); an option given keeps its value."""
    out = dict(options)
    if position == "fire":
        out.setdefault("threshold", train_length * FIRE_THRESHOLD_RATIO)
    if position == "rotary" and out.get("xpos"):
        out.setdefault("xpos_scale_base", train_length * XPOS_SCALE_BASE_RATIO)
    return out


def recipe_notes(rows: list[dict[str, Any]], train_length: float) -> list[str]:
    """A report's sentences on what `length_recipe` set for the rows (config mappings) that
    leave it to the study: FIRE's threshold, xPos's scale base."""
    added: set[str] = set()  # the keys length_recipe adds to some row (it leaves them to us)
    for r in rows:
        given = r["options"]
        recipe = length_recipe(r["position"], given, train_length=train_length)
        added |= recipe.keys() - given.keys()
    notes = []
    if "threshold" in added:
        notes.append(
            f"FIRE: threshold {train_length * FIRE_THRESHOLD_RATIO:g} (L / 4 of the training "
            "length, as the authors' 512 of 2048)."
        )
    if "xpos_scale_base" in added:
        notes.append(
            f"xPos: scale base {train_length * XPOS_SCALE_BASE_RATIO:g} (L / 2, as its paper's "
            "512 of 1024)."
        )
    return notes
