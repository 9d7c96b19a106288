"""Whether a Mersenne Twister's new state continues its old one: the test behind "the defense reseeded a global RNG".

torch's CPU generator, numpy's legacy global ``RandomState`` and Python's ``random`` are all MT19937: a state is a key
of 624 words and a position in it; drawing moves the position, and at the key's end the key is replaced by its
*twist*. So a state continues another exactly when its key is the other's key (at a later position) or one of its
next twists. numpy's ``MT19937`` bit generator draws the words of the next blocks in one call, and a block's words are
its key *tempered* (a bijection, word by word), so the search compares tempered keys with the blocks drawn.

No library answers "is state B reachable from state A", hence this module.

A search that finds nothing costs the whole look-ahead (about 60 ms), and a defense that reseeds a generator in every
call (``np.random.seed(0)`` in ``forward``) has the guard ask the same question in every call: the same key before
(the guard put it back) and the same key after. So the answer for a pair of keys is remembered (the last
:data:`REMEMBERED` pairs): a pure function of its arguments, so remembering changes no answer, only its cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

WORDS = 624  # words in an MT19937 key
# keys searched ahead: 20.4M words (about 60 ms, paid in full only by a generator that did not continue); a call that
# drew more words than that from one generator reads as having reseeded it (docs/diagnostics.md)
MAX_BLOCKS = 32768
_CHUNK = 256
REMEMBERED = 64  # pairs of keys whose answer is kept: a generator per piece of process state, with room to spare


@dataclass(frozen=True)
class MTState:
    """One MT19937 state: its 624-word ``key`` and the position ``pos`` of the next word (624: the key is used up)."""
    key: np.ndarray
    pos: int

    def same(self, other: MTState) -> bool:
        return self.pos == other.pos and bool(np.array_equal(self.key, other.key))


def _temper(words: np.ndarray) -> np.ndarray:
    y = words.astype(np.uint32, copy=True)
    y ^= y >> np.uint32(11)
    y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
    y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
    y ^= y >> np.uint32(18)
    return y


def continues(before: MTState, after: MTState, max_blocks: int = MAX_BLOCKS) -> bool:
    """Whether ``after`` is ``before`` advanced by at most ``max_blocks`` keys of draws; False means the generator was
    reseeded or set to another state (or drew more than that)."""
    if np.array_equal(before.key, after.key):
        return after.pos >= before.pos
    return _key_follows(before.key.astype(np.uint32).tobytes(), after.key.astype(np.uint32).tobytes(), max_blocks)


@lru_cache(maxsize=REMEMBERED)
def _key_follows(before: bytes, after: bytes, max_blocks: int) -> bool:
    """Whether the key ``after`` is one of the next ``max_blocks`` twists of the key ``before`` (both as uint32
    bytes)."""
    target = _temper(np.frombuffer(after, dtype=np.uint32))
    generator = np.random.MT19937()
    generator.state = {"bit_generator": "MT19937", "state": {"key": np.frombuffer(before, dtype=np.uint32),
                                                            "pos": WORDS}}
    for start in range(0, max_blocks, _CHUNK):
        blocks = generator.random_raw(WORDS * min(_CHUNK, max_blocks - start)).astype(np.uint32).reshape(-1, WORDS)
        if bool((blocks[:, 0] == target[0]).any()) and bool((blocks == target).all(1).any()):
            return True
    return False
