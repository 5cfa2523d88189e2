"""The augmentations of `cape.position_sampling`, each against its paper's definition:

- randomized positions (Ruoss et al. 2023): sorted, distinct integers of [0, N), every subset of
  size T equally likely (chi-square over all C(N, T) subsets of small cases);
- PoSE (Zhu et al. 2024, sec. 3.2): u_0 = 0 <= u_1 <= ... <= L_t - n, u_i uniform on
  {u_(i-1), ..., L_t - n} (chi-square against that law), chunks cut uniformly, and the relative
  distances of [0, L_t) all met over draws;
- random float sampling (Shimizu et al. 2026): sorted i.i.d. U[0, 1) times L (KS tests of the
  pooled values and of an order statistic against its Beta law);

and the contract they share with CAPE's `Augmentation`: identity in eval, padding kept at 0,
reproducible draws from a generator on the positions' device, appended padding changing
nothing, `pair`, `reach`, the mapping form, bad options refused by name.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

import cape
from cape.augment import Augmentation, check_augmentation
from cape.encodings.grids import max_scaling_of
from cape.integrations.hf import augmented_position_ids
from cape.position_sampling import (
    AUGMENTATION_KINDS,
    PoSE,
    RandomFloatPositions,
    RandomizedPositions,
    augmentation_from_mapping,
)

ALPHA = 1e-3  # a correct sampler fails a test at this rate


@pytest.fixture
def stats():
    return pytest.importorskip("scipy.stats", reason="scipy is in the test extra")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tokens(batch: int, length: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    return cape.token_positions(batch, length, mask=mask)


SAMPLERS = {
    "randomized": RandomizedPositions(24),
    "pose": PoSE(24),
    "pose-3": PoSE(24, chunks=3),
    "random-float": RandomFloatPositions(8.0),
    "cape": Augmentation(max_global_shift=2.0, max_local_shift=0.5, max_global_scaling=1.5),
}
NEW = [k for k in SAMPLERS if k != "cape"]


# --- randomized positions (Ruoss et al.) ---------------------------------------------------------


def test_randomized_positions_are_sorted_distinct_integers_below_n() -> None:
    mask = torch.rand(64, 10, generator=gen(1)) < 0.8
    out = RandomizedPositions(12, spacing=0.5)(tokens(64, 10, mask), mask, generator=gen(2))
    k = out[..., 0] / 0.5  # the subset, in units of spacing
    assert torch.equal(k, k.round()) and bool((k >= 0).all()) and bool((k < 12).all())
    for row, m in zip(k, mask, strict=True):
        real = row[m]
        assert bool((real[1:] > real[:-1]).all())  # sorted and distinct
        assert bool((row[~m] == 0).all())  # padding kept at 0


@pytest.mark.parametrize(("length", "n_max"), [(2, 4), (3, 5)])
def test_randomized_subsets_are_uniform(stats, length: int, n_max: int) -> None:
    subsets = list(itertools.combinations(range(n_max), length))
    draws = 600 * len(subsets)
    out = RandomizedPositions(n_max)(tokens(draws, length), generator=gen(3))[..., 0]
    counts = Counter(tuple(int(v) for v in row) for row in out)
    assert set(counts) == set(subsets)  # every subset reachable, nothing else
    test = stats.chisquare([counts[s] for s in subsets])
    assert test.pvalue > ALPHA, test


def test_randomized_subsets_of_padded_rows_are_uniform_over_their_real_count(stats) -> None:
    # rows of 2 real tokens in a batch padded to 4: subsets of size 2 of [0, 5)
    mask = torch.tensor([[True, True, False, False]]).expand(6000, 4)
    out = RandomizedPositions(5)(tokens(6000, 4, mask), mask, generator=gen(4))[..., 0]
    subsets = list(itertools.combinations(range(5), 2))
    counts = Counter((int(a), int(b)) for a, b in out[:, :2])
    assert set(counts) == set(subsets) and bool((out[:, 2:] == 0).all())
    assert stats.chisquare([counts[s] for s in subsets]).pvalue > ALPHA


def test_randomized_t_above_n_is_refused_in_training_only() -> None:
    aug = RandomizedPositions(4)
    with pytest.raises(ValueError, match="max_length"):
        aug(tokens(1, 5), generator=gen())
    assert torch.equal(aug(tokens(1, 5), training=False), tokens(1, 5))


def test_randomized_sample_at_eval_draws_the_same_law_in_eval_mode(stats) -> None:
    # the authors' models draw a subset at every call, evaluation included
    aug = RandomizedPositions(5, sample_at_eval=True)
    assert aug.draws(False) and aug.draws(True)
    assert not RandomizedPositions(5).draws(False) and RandomizedPositions(5).draws(True)
    subsets = list(itertools.combinations(range(5), 3))
    out = aug(tokens(600 * len(subsets), 3), training=False, generator=gen(5))[..., 0]
    counts = Counter(tuple(int(v) for v in row) for row in out)
    assert set(counts) == set(subsets)
    assert stats.chisquare([counts[s] for s in subsets]).pvalue > ALPHA
    # reproducible from a generator; T = N leaves one subset, the plain positions
    pos = tokens(4, 5)
    a = aug(pos, training=False, generator=gen(6))
    assert torch.equal(a, aug(pos, training=False, generator=gen(6)))
    assert torch.equal(aug(pos, training=False, generator=gen(7)), pos)
    with pytest.raises(ValueError, match="max_length"):
        aug(tokens(1, 6), training=False)  # T > N is refused wherever it draws
    with pytest.raises(TypeError, match="sample_at_eval"):
        RandomizedPositions(5, sample_at_eval="yes")  # type: ignore[arg-type]
    assert aug.as_mapping() == {
        "kind": "randomized",
        "max_length": 5,
        "spacing": 1.0,
        "sample_at_eval": True,
    }
    assert augmentation_from_mapping(aug.as_mapping()) == aug


@pytest.mark.parametrize("position", ["rotary", "alibi", "cape1d"])
def test_a_model_sampling_at_eval_draws_in_eval_and_has_no_cache(position: str) -> None:
    # every encoding reads the draw in eval mode (rotary's shared row, ALiBi's bias, the
    # absolute table cache all step aside), and a key/value cache is refused by name
    aug = {"kind": "randomized", "max_length": 64, "sample_at_eval": True}
    torch.manual_seed(0)
    size = dict(dim=32, layers=2, heads=2, ffn_dim=64, dropout=0.0, position=position)
    model = cape.models.CausalLM(50, **size, position_options={"augmentation": aug}).eval()
    plain = cape.models.CausalLM(50, **size).eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (2, 12), generator=gen(8))
    with torch.no_grad():
        torch.manual_seed(1)
        a = model(ids)
        torch.manual_seed(1)
        assert torch.equal(a, model(ids))  # the draws come from the seeded global generator
        torch.manual_seed(2)
        assert not torch.equal(a, model(ids))
        assert not torch.equal(a, plain(ids))
    assert not model.can_cache and plain.can_cache
    with pytest.raises(ValueError, match="cache"):
        model.start_cache()


# --- PoSE (Zhu et al.) ---------------------------------------------------------------------------


def _pose_skips_and_cuts(out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The shift of every token (out - pos) [B, T]."""
    return (out - pos)[..., 0]


def test_pose_chunks_are_shifted_blocks_that_stay_below_the_target() -> None:
    n, target = 12, 40
    pos = tokens(2000, n)
    out = PoSE(target, chunks=3)(pos, generator=gen(5))
    shift = _pose_skips_and_cuts(out, pos)
    assert torch.equal(shift, shift.round()) and bool((shift[:, 0] == 0).all())  # u_0 = 0
    assert bool((shift[:, 1:] >= shift[:, :-1]).all())  # u_(i-1) <= u_i
    assert bool((out[..., 0] <= target - 1).all())  # u_(N-1) <= L_t - n
    # at most N = 3 chunks: the shift changes at most twice per row
    assert int((shift[:, 1:] != shift[:, :-1]).sum(dim=1).max()) <= 2


def test_pose_relative_distances_cover_the_target_window() -> None:
    n, target = 8, 32
    out = PoSE(target)(tokens(3000, n), generator=gen(6))[..., 0]
    distances = (out[:, None, :] - out[:, :, None]).flatten()
    met = set(int(d) for d in distances.unique() if d >= 0)
    assert met == set(range(target))  # [0, L_t), nothing beyond


def test_pose_skips_follow_the_papers_law(stats) -> None:
    # u_1 ~ U{0..R}, then u_2 | u_1 ~ U{u_1..R}: P(a, b) = 1 / ((R + 1)(R - a + 1)), b >= a
    n, target, draws = 6, 9, 20000
    room = target - n
    aug = PoSE(target, chunks=3)
    pos = tokens(draws, n)
    skips = aug._skips(torch.full((draws, 1), n), pos, gen(7))
    assert bool((skips[:, 0] == 0).all())
    pairs = Counter((int(a), int(b)) for a, b in skips[:, 1:])
    cells = [(a, b) for a in range(room + 1) for b in range(a, room + 1)]
    assert set(pairs) == set(cells)
    expected = [draws / ((room + 1) * (room - a + 1)) for a, _ in cells]
    assert stats.chisquare([pairs[c] for c in cells], expected).pvalue > ALPHA


def test_pose_cuts_are_uniform_and_padding_leaves_chunks_empty(stats) -> None:
    n, draws = 6, 10000
    aug = PoSE(20, chunks=3)
    cuts = aug._cuts(torch.full((draws, 1), n), tokens(draws, n), gen(8))
    pairs = Counter((int(a), int(b)) for a, b in cuts)
    subsets = list(itertools.combinations(range(1, n), 2))  # 2 cuts among the n - 1 gaps
    assert set(pairs) == set(subsets)
    assert stats.chisquare([pairs[s] for s in subsets]).pvalue > ALPHA
    # a sample of 2 real tokens has 1 gap: its second cut is n (an empty last chunk)
    few = aug._cuts(torch.tensor([[2]]), tokens(1, 4), gen(9))
    assert few.tolist() == [[1, 2]]


def test_pose_window_above_the_target_is_refused_in_training() -> None:
    with pytest.raises(ValueError, match="target_length"):
        PoSE(4)(tokens(1, 5), generator=gen())


# --- random float sampling (Shimizu et al.) ------------------------------------------------------


def test_random_float_positions_are_sorted_uniform_draws(stats) -> None:
    n, length, draws = 5, 8.0, 4000
    out = RandomFloatPositions(length)(tokens(draws, n), generator=gen(10))[..., 0]
    assert bool((out[:, 1:] >= out[:, :-1]).all()) and bool((out >= 0).all())
    assert bool((out < length).all())
    # the pooled values: U(0, L); the k-th smallest of n: L x Beta(k, n + 1 - k)
    assert stats.kstest(out.flatten().double().numpy() / length, "uniform").pvalue > ALPHA
    for k in (1, 3, 5):
        beta = stats.beta(k, n + 1 - k)
        assert stats.kstest(out[:, k - 1].double().numpy() / length, beta.cdf).pvalue > ALPHA


def test_random_float_padded_rows_sort_their_real_tokens_only() -> None:
    mask = torch.tensor([[True, True, True, False, False]] * 3)
    out = RandomFloatPositions(4.0)(tokens(3, 5, mask), mask, generator=gen(11))[..., 0]
    assert bool((out[:, 3:] == 0).all()) and bool((out[:, 1:3] >= out[:, :2]).all())
    assert bool((out[:, :3] < 4.0).all())


# --- the contract every augmentation keeps -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_eval_is_the_identity_and_training_draws(name: str) -> None:
    aug = SAMPLERS[name]
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    pos = tokens(2, 6, mask)
    assert torch.equal(aug(pos, mask, training=False), pos)
    assert aug.random and not aug.normalize
    drawn = aug(pos, mask, generator=gen(12))
    assert drawn.dtype == torch.float32 and drawn.shape == pos.shape
    assert not torch.equal(drawn, pos) and bool((drawn[1, 4:] == 0).all())


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_draws_are_reproducible_and_appended_padding_changes_nothing(name: str) -> None:
    aug = SAMPLERS[name]
    mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    pos = tokens(2, 7, mask)
    a = aug(pos, mask, generator=gen(13))
    assert torch.equal(a, aug(pos, mask, generator=gen(13)))
    assert not torch.equal(a, aug(pos, mask, generator=gen(14)))
    wide = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], dim=1)  # 3 more padding
    b = aug(tokens(2, 10, wide), wide, generator=gen(13))
    torch.testing.assert_close(b[:, :7], a, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_draws_happen_on_the_positions_device(name: str) -> None:
    aug = SAMPLERS[name]
    meta = torch.zeros(2, 5, 1, device="meta")
    assert aug(meta).device.type == "meta" and aug(meta).shape == (2, 5, 1)
    with pytest.raises(ValueError, match="generator"):
        aug(meta, generator=gen())  # a CPU generator cannot draw meta tensors


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_reach_bounds_every_augmented_position(name: str) -> None:
    aug = SAMPLERS[name]
    for seed in range(20):
        pos = torch.rand(4, 9, 1, generator=gen(seed)) * 9.0  # |p| <= 9
        out = aug(pos, generator=gen(100 + seed))
        assert float(out.abs().max()) <= aug.reach(9.0) + 1e-4
        assert float(aug(pos, training=False).abs().max()) <= aug.reach(9.0)


def test_reach_of_each_kind_is_its_formula() -> None:
    assert Augmentation(2.0, (0.5, 0.25), 1.5).reach(10.0) == (10.0 + 2.0 + 0.5) * 1.5
    assert RandomizedPositions(100, spacing=0.5).reach(3.0) == 49.5
    assert RandomizedPositions(4).reach(30.0) == 30.0  # eval: the positions as given
    assert PoSE(64, spacing=2.0).reach(5.0) == 5.0 + 126.0
    assert RandomFloatPositions(16.0).reach(3.0) == 16.0


@pytest.mark.parametrize("name", NEW)
def test_pair_draws_each_side_in_turn_after_scaling_the_source(name: str) -> None:
    aug = SAMPLERS[name]
    src, tgt = tokens(3, 5), tokens(3, 7)
    s_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 5])
    g = gen(15)
    want_s = aug(src * 1.5, s_mask, generator=g)
    want_t = aug(tgt, generator=g)
    got = aug.pair(src, tgt, s_mask, None, alpha=1.5, generator=gen(15))
    assert torch.equal(got[0], want_s) and torch.equal(got[1], want_t)
    ev = aug.pair(src, tgt, s_mask, None, alpha=1.5, training=False)
    assert torch.equal(ev[0], torch.where(s_mask[..., None], src * 1.5, 0.0))
    assert torch.equal(ev[1], tgt)


@pytest.mark.parametrize("name", NEW)
def test_bad_calls_are_refused_by_name(name: str) -> None:
    aug = SAMPLERS[name]
    pos = tokens(2, 4)
    cases = [
        (lambda: aug(pos.long()), TypeError, "positions"),
        (lambda: aug(pos, torch.ones(2, 4)), ValueError, "mask"),
        (lambda: aug(pos, training="yes"), TypeError, "training"),
        (lambda: aug(pos, generator=3), TypeError, "generator"),
        (lambda: aug(torch.zeros(2, 4, 2)), ValueError, "positions"),  # 1-D samplers
        (lambda: aug(pos[0], name="q_positions"), ValueError, "q_positions"),
        (lambda: aug.pair(pos, tokens(3, 4)), ValueError, "source"),
        (lambda: aug.pair(pos, pos, alpha=0.0), ValueError, "alpha"),
    ]
    for call, error, word in cases:
        with pytest.raises(error, match=word):
            call()


@pytest.mark.parametrize(
    ("make", "word"),
    [
        (lambda: RandomizedPositions(0), "max_length"),
        (lambda: RandomizedPositions(2.5), "max_length"),
        (lambda: RandomizedPositions(True), "max_length"),
        (lambda: RandomizedPositions(8, spacing=0.0), "spacing"),
        (lambda: RandomizedPositions(8, spacing=math.nan), "spacing"),
        (lambda: RandomizedPositions(10**30, spacing=1e10), "max_length"),
        (lambda: PoSE(0), "target_length"),
        (lambda: PoSE(8, chunks=1), "chunks"),
        (lambda: PoSE(8, chunks="2"), "chunks"),
        (lambda: PoSE(8, spacing=-1.0), "spacing"),
        (lambda: RandomFloatPositions(0.0), "train_length"),
        (lambda: RandomFloatPositions(math.inf), "train_length"),
        (lambda: RandomFloatPositions("8"), "train_length"),
    ],
)
def test_bad_options_are_refused_by_name(make, word: str) -> None:
    with pytest.raises((TypeError, ValueError), match=word):
        make()


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_mapping_form_round_trips_through_build(name: str) -> None:
    aug = SAMPLERS[name]
    mapping = aug.as_mapping()
    assert mapping["kind"] in AUGMENTATION_KINDS and augmentation_from_mapping(mapping) == aug
    assert check_augmentation(aug) is aug
    for form in (aug, mapping):
        built = cape.build("rotary", 8, augmentation=form)
        assert built.augmentation == aug
    # a preset's fields give way to another kind of augmentation (its other values stay)
    if name != "cape":
        built = cape.build("cape1d", 8, preset="audio", augmentation=mapping)
        assert built.augmentation == aug and built.freq_scale == 30.0


def test_mapping_form_refuses_unknown_kinds_and_fields() -> None:
    with pytest.raises(ValueError, match=r"augmentation\['kind'\]"):
        augmentation_from_mapping({"kind": "nope"})
    with pytest.raises(TypeError, match="max_global_shift"):
        cape.build(
            "rotary", 8, augmentation={"kind": "pose", "target_length": 8, "max_global_shift": 1.0}
        )
    with pytest.raises(TypeError, match="target_length"):
        cape.build("alibi", 2, augmentation={"kind": "pose"})
    with pytest.raises(ValueError, match="not both"):
        cape.build(
            "rotary", 8, augmentation={"kind": "pose", "target_length": 8}, max_local_shift=0.5
        )
    # without a kind, a mapping holds CAPE's fields, as config files always wrote them
    plain = cape.build("rotary", 8, augmentation={"kind": "cape", "max_global_shift": 2.0})
    assert plain.augmentation == Augmentation(max_global_shift=2.0)


def test_phase_checks_and_hf_hook_read_any_augmentation() -> None:
    assert max_scaling_of(RandomizedPositions(8)) == 1.0 == max_scaling_of(None)
    assert max_scaling_of(Augmentation(max_global_scaling=1.4)) == 1.4
    mask = torch.tensor([[1, 1, 1, 0]])
    ids = augmented_position_ids(RandomizedPositions(50), mask, generator=gen(16))
    assert ids.shape == (1, 4) and ids[0, 3] == 0 and bool((ids[0, 1:3] > ids[0, :2]).all())
