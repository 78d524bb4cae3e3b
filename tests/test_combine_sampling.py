"""sample_from, choose_from, rejection_resample."""

from __future__ import annotations

import numpy as np
import pytest

import aioflow as af
from tests.conftest import assert_no_pending_tasks
from tests.test_transforms import Boom


def reference_sample(lists, weights, seed, stop_on_empty=False, epoch=0):
    """tf.data's sample_from_datasets with the draws the operator makes."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    w = np.asarray(weights, dtype=float) / sum(weights)
    cum = np.cumsum(w)
    its = [iter(x) for x in lists]
    live = [x > 0 for x in w]
    out = []
    while any(live):
        for i in np.minimum(np.searchsorted(cum, rng.random(256), side="right"), len(its) - 1):
            if not live[i]:
                continue
            try:
                out.append(next(its[i]))
            except StopIteration:
                live[i] = False
                if stop_on_empty or not any(live):
                    return out
    return out


# -- sample_from ---------------------------------------------------------------------------
def test_sample_from_follows_the_weights_and_the_seed_exactly():
    a, b = list(range(300)), [f"b{i}" for i in range(100)]
    p = af.sample_from([af.from_iterable(a), af.from_iterable(b)], [0.7, 0.3], seed=11)
    want = reference_sample([a, b], [0.7, 0.3], 11)
    assert p.to_list() == want
    assert sorted(map(str, want)) == sorted(map(str, a + b))  # nothing lost when one ends


def test_sample_from_renormalizes_when_an_input_ends_and_can_stop_instead():
    short, long = list(range(5)), [f"x{i}" for i in range(500)]
    mix = af.sample_from([af.from_iterable(short), af.from_iterable(long)], seed=2)
    out = mix.to_list()
    assert len(out) == 505 and [x for x in out if isinstance(x, int)] == short
    stop = af.sample_from(
        [af.from_iterable(short), af.from_iterable(long)], seed=2, stop_on_empty=True
    )
    got = stop.to_list()
    assert got == reference_sample([short, long], [1, 1], 2, stop_on_empty=True)
    assert [x for x in got if isinstance(x, int)] == short and len(got) < 505


def test_sample_from_proportions_over_infinite_inputs():
    mix = af.sample_from([af.range(1).repeat(), af.range(1, 2).repeat()], [0.8, 0.2], seed=0)
    out = mix.take(5000).to_list()
    assert 0.77 < out.count(0) / 5000 < 0.83
    assert mix.cardinality() == af.INFINITE


def test_sample_from_reproducible_per_seed_and_new_each_epoch():
    def make():
        return af.sample_from([af.range(50), af.range(100, 150)], seed=4)

    p = make()
    first, second = p.to_list(), p.to_list()
    assert make().to_list() == first and first != second
    assert second == reference_sample([range(50), range(100, 150)], [1, 1], 4, epoch=1)


def test_sample_from_zero_weight_input_is_never_read():
    p = af.sample_from([af.range(10), af.range(100, 110)], [1.0, 0.0], seed=0)
    assert p.to_list() == list(range(10))


def test_sample_from_checks_weights():
    with pytest.raises(af.PipelineError):
        af.sample_from([af.range(2)], [0.5, 0.5])
    with pytest.raises(af.PipelineError):
        af.sample_from([af.range(2), af.range(2)], [-1, 2])
    with pytest.raises(af.PipelineError):
        af.sample_from([])


async def test_sample_from_passes_an_input_error_after_earlier_items():
    def fail(x):
        if x == 30:
            raise Boom("x")
        return x

    p = af.sample_from([af.range(100).map(fail), af.range(100, 200)], seed=0)
    got = []
    with pytest.raises(Boom):
        async with p.aiter() as it:
            async for x in it:
                got.append(x)
    assert [x for x in got if x < 100] == list(range(30))
    await assert_no_pending_tasks()


# -- choose_from -----------------------------------------------------------------------------
def test_choose_from_follows_the_choices():
    choices = af.from_iterable([0, 1, 1, 0, 2, 2, 0])
    p = af.choose_from([af.range(10), af.from_iterable("ab"), af.range(100, 102)], choices)
    assert p.to_list() == [0, "a", "b", 1, 100, 101, 2]


def test_choose_from_stops_at_the_first_choice_of_an_exhausted_input():
    p = af.choose_from([af.range(2), af.from_iterable("a")], af.from_iterable([1, 0, 1, 0, 0]))
    assert p.to_list() == ["a", 0]  # the second 1 finds input 1 exhausted: the end
    forever = af.range(2).repeat()
    assert af.choose_from([af.range(3), af.range(10, 12)], forever).to_list() == [
        0,
        10,
        1,
        11,
        2,
    ]


def test_choose_from_accepts_numpy_indices_and_ends_with_the_choices():
    choices = af.from_iterable(np.array([1, 0, 1], dtype=np.int64))
    assert af.choose_from([af.range(5), af.range(5, 10)], choices).to_list() == [5, 0, 6]


def test_choose_from_out_of_range_index_is_an_error_after_the_items_before_it():
    p = af.choose_from([af.range(5), af.range(5, 10)], af.from_iterable([0, 1, 2, 0]))
    got = []
    with pytest.raises(af.PipelineError, match="choice 2 at position 2"), p.iter() as it:
        for x in it:
            got.append(x)
    assert got == [0, 5]
    with pytest.raises(af.PipelineError):
        af.choose_from([af.range(2)], af.from_iterable([-1])).to_list()
    with pytest.raises(af.PipelineError):
        af.choose_from([af.range(2)], [0, 0])


# -- rejection_resample ---------------------------------------------------------------------
def test_rejection_resample_with_a_known_distribution_is_exact_per_seed():
    labels = np.random.default_rng(1).random(5000) < 0.1
    items = [(i, int(c)) for i, c in enumerate(labels)]
    p = af.from_iterable(items).rejection_resample(
        lambda t: t[1], [0.5, 0.5], initial_dist=[0.9, 0.1], seed=3
    )
    out = p.to_list()
    # keep class 1 always, class 0 with probability (0.5/0.9) / (0.5/0.1) = 1/9
    rng = np.random.default_rng(np.random.SeedSequence([3, 0]))
    accept = np.where(labels, 1.0, 1 / 9)
    want = [x for x, u in zip(items, rng.random(len(items)), strict=True) if u < accept[x[0]]]
    assert [x[0] for x in out] == [x[0] for x in want]
    assert {t for t in items if t[1]} <= set(out)  # every positive is kept
    assert 0.4 < sum(t[1] for t in out) / len(out) < 0.6


def test_rejection_resample_estimates_the_initial_distribution_online():
    rng = np.random.default_rng(5)
    classes = rng.choice(3, size=20_000, p=[0.7, 0.2, 0.1])
    p = af.from_iterable(classes.tolist()).rejection_resample(
        lambda c: c, [1 / 3, 1 / 3, 1 / 3], seed=0
    )
    out = np.asarray(p.to_list())
    freq = np.bincount(out, minlength=3) / len(out)
    assert np.all(np.abs(freq - 1 / 3) < 0.04), freq
    assert p.to_list() != out.tolist()  # a new epoch draws anew


def test_rejection_resample_of_empty_input_and_a_target_of_the_initial_keeps_everything():
    assert af.range(0).rejection_resample(lambda x: 0, [1.0], seed=0).to_list() == []
    p = af.range(100).rejection_resample(lambda x: x % 2, [0.5, 0.5], initial_dist=[0.5, 0.5])
    assert p.to_list() == list(range(100))
    half = np.array([0.5, 0.5])  # numpy distributions work as well as lists
    q = af.range(100).rejection_resample(lambda x: x % 2, half, initial_dist=half, seed=1)
    assert q.to_list() == list(range(100))


def test_rejection_resample_rejects_bad_classes_and_distributions():
    with pytest.raises(af.PipelineError, match="outside"):
        af.range(5).rejection_resample(lambda x: x, [0.5, 0.5], seed=0).to_list()
    with pytest.raises(af.PipelineError):
        af.range(5).rejection_resample(lambda x: 0, [0.5, -0.5])
    with pytest.raises(af.PipelineError):
        af.range(5).rejection_resample(lambda x: 0, [0.5, 0.5], initial_dist=[1.0, 0.0])
    with pytest.raises(af.PipelineError):
        af.range(5).rejection_resample(lambda x: 0, [0.5, 0.5], initial_dist=[1.0])


def test_rejection_resample_class_fn_error_comes_after_earlier_items():
    def cls(x):
        if x == 700:
            raise Boom("c")
        return 0

    got = []
    p = af.range(1000).rejection_resample(cls, [1.0], seed=0)
    with pytest.raises(Boom) as info, p.iter() as it:
        for x in it:
            got.append(x)
    assert got == list(range(700))
    assert any("at item 700" in n for n in info.value.__notes__)


def test_a_seeded_mix_and_resampling_resume_from_a_state():
    def make():
        mix = af.sample_from([af.range(200), af.range(1000, 1200)], [0.3, 0.7], seed=5)
        return mix.rejection_resample(lambda x: int(x >= 1000), [0.5, 0.5], seed=6)

    p = make()
    p.to_list()  # epoch 0; the second one is interrupted and resumed
    with p.iter() as it:
        head = [next(it) for _ in range(25)]
        state = it.state_dict()
    rest = list(p.iter(state=state))
    fresh = make()
    fresh.to_list()
    assert head + rest == fresh.to_list()
