"""Whether a Mersenne Twister's new state continues its old one (``harness.watch.rng``), for the three global
generators that use it, across draw counts from none to millions; and never for a reseed."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from harness.watch.process_state import _numpy_mt, _python_mt, _torch_mt
from harness.watch.rng import MAX_BLOCKS, WORDS, MTState, continues


@pytest.mark.parametrize("draws", [0, 1, 623, 624, 625, 10_000, 1_000_000])
def test_draws_continue_the_state_in_each_generator(draws):
    rs = np.random.RandomState(3)
    before = _numpy_mt(rs.get_state())
    rs.random_sample(draws)
    assert continues(before, _numpy_mt(rs.get_state()))

    py = random.Random(3)
    before = _python_mt(py.getstate())
    for _ in range(min(draws, 20_000)):
        py.random()
    assert continues(before, _python_mt(py.getstate()))

    gen = torch.Generator().manual_seed(3)
    before_t = _torch_mt(gen.get_state())
    torch.rand(draws, generator=gen)
    assert before_t is not None and continues(before_t, _torch_mt(gen.get_state()))


@pytest.mark.parametrize("drawn", [0, 5, 5000])
def test_a_reseed_does_not_continue(drawn):
    """Reseeding to another seed and drawing is not a continuation, nor is going back; reseeding to the generator's
    own seed is one only when it lands where drawing would have (then nothing is lost, and nothing is said)."""
    rs = np.random.RandomState(3)
    rs.random_sample(drawn)
    before = _numpy_mt(rs.get_state())
    for seed in (0, 12345):
        rs.seed(seed)
        rs.random_sample(7)
        assert not continues(before, _numpy_mt(rs.get_state()))
    rs.seed(3)
    rs.random_sample(7)  # 14 words from the seed: behind the state when it had drawn 5000 (10,000 words)
    assert continues(before, _numpy_mt(rs.get_state())) == (2 * drawn <= 14)
    later = np.random.RandomState(3)
    later.random_sample(drawn + 2000)
    assert not continues(_numpy_mt(later.get_state()), before)


def test_more_draws_than_the_search_reads_as_a_reseed():
    """The stated limit: a call drawing more than MAX_BLOCKS keys of words is not told from a reseed."""
    gen = np.random.MT19937(1)
    key = gen.state["state"]["key"]
    before = MTState(key, WORDS)
    gen.random_raw(WORDS * 4)
    assert continues(before, MTState(gen.state["state"]["key"], WORDS), max_blocks=4)
    assert not continues(before, MTState(gen.state["state"]["key"], WORDS), max_blocks=3)
    assert MAX_BLOCKS * WORDS > 20_000_000


def test_a_generator_reseeded_in_every_call_is_searched_once(monkeypatch):
    """A defense that calls ``np.random.seed(0)`` in every forward pass has the guard ask the same question after
    every call (the same key put back before, the same key after): each call still finds the reseed and puts the
    state back, but only the first pays for the search (about 60 ms a call otherwise)."""
    from harness.watch.process_state import Snapshot

    searches = []
    real = np.random.MT19937

    def counted(*args):
        searches.append(args)
        return real(*args)

    monkeypatch.setattr(np.random, "MT19937", counted)
    saved = np.random.get_state()
    np.random.seed(20261207)  # a state no other test's search started from
    try:
        for _ in range(5):
            before = Snapshot.take()
            np.random.seed(0)
            np.random.random_sample(3)
            assert before.restore_changed() == ["numpy's global RNG"]
    finally:
        np.random.set_state(saved)
    assert len(searches) == 1
