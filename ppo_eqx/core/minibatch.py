"""A minibatch's rows taken from the update's batch (``row_taker``): the one gather of each minibatch step, laid
out for the device that takes it."""

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree

PACKED_WIDTH = 64
"""A field whose rows hold at most this many 4-byte words is taken in the one packed gather (``row_taker``)."""


def _as_words(x: Array, small: bool) -> Array | None:
    """``x``'s rows as ``uint32`` words (``[rows, words]``, the same bits), or None where a row is not a whole number
    of words of a 4-byte type, or (where ``small``) of a 1- or 2-byte one (booleans, 8-byte numbers, odd rows of
    bytes)."""
    rows, items = x.shape[0], math.prod(x.shape[1:])
    size = x.dtype.itemsize
    if x.dtype == jnp.bool_ or size > 4 or (size < 4 and not small) or items == 0 or (items * size) % 4:
        return None
    flat = x.reshape(rows, -1) if size == 4 else x.reshape(rows, items * size // 4, 4 // size)
    return jax.lax.bitcast_convert_type(flat, jnp.uint32)


def _from_words(words: Array, like: Array) -> Array:
    """The rows ``words`` (``_as_words``'s form) as ``like``'s dtype and row shape."""
    values = jax.lax.bitcast_convert_type(words, like.dtype)
    return values.reshape(words.shape[0], *like.shape[1:])


def row_taker(batch: PyTree, *, small_as_words: bool | None = None) -> Callable[[Int[Array, " mb"]], PyTree]:
    """``take(index)``: the rows ``index`` of every leaf of ``batch``, as ``jnp.take`` takes them. The bits are moved,
    not computed: each field's rows are the ones its own ``jnp.take`` gives.

    On a TPU a gather costs by the row taken, not by its width, and a row that is not one contiguous run of 4-byte
    words is taken slowly: 8 MinAtar agents' ``[8192, 10, 10, 4]`` bfloat16 frames were gathered in 2.8 ms, three
    fifths of the program. So every leaf is taken as rows of ``uint32`` words, made here, once: the leaves with
    narrow rows (at most ``PACKED_WIDTH`` words: the actions, log-probabilities, values, advantages, returns,
    vector observations) as the columns of one array, in one gather a minibatch; a wider one (frames, grids) in its
    own. A leaf that is not whole words (booleans) is taken on its own, its rows flattened.

    Rows of 1- or 2-byte numbers (uint8 frames, bfloat16 grids) are made words where ``small_as_words`` (default:
    off the CPU backend). On a CPU the conversion costs more than it saves: Atari's uint8 frames (1,024 rows, 4
    minibatches) took 2.5 times as long taken as words on the 2-core AMD EPYC; their rows flattened, as long as
    before."""
    leaves, treedef = jax.tree.flatten(batch)
    small = jax.default_backend() != "cpu" if small_as_words is None else small_as_words
    words: dict[int, Array] = {}
    for i, x in enumerate(leaves):
        if x.ndim >= 1 and (as_words := _as_words(x, small)) is not None:
            words[i] = as_words
    narrow = [i for i, w in words.items() if w.shape[1] <= PACKED_WIDTH]
    if len(narrow) < 2:
        narrow = []
    packed = jnp.concatenate([words[i] for i in narrow], axis=1) if narrow else None
    ends = list(itertools.accumulate(words[i].shape[1] for i in narrow))

    def take_rows(x: Array, index: Int[Array, " mb"]) -> Array:
        # The rows are a permutation, always in bounds: "clip" is XLA's own gather, where jnp's default ("fill")
        # adds a select over every gathered row.
        return jnp.take(x, index, axis=0, mode="clip")

    def take(index: Int[Array, " mb"]) -> PyTree:
        taken: list[Any] = []
        for i, x in enumerate(leaves):
            if i in narrow:
                taken.append(None)
            elif i in words:
                taken.append(_from_words(take_rows(words[i], index), x))
            elif x.ndim >= 2:
                taken.append(take_rows(x.reshape(x.shape[0], -1), index).reshape(index.shape[0], *x.shape[1:]))
            else:
                taken.append(take_rows(x, index))
        if packed is not None:
            packed_rows = take_rows(packed, index)
            for i, start, stop in zip(narrow, [0, *ends[:-1]], ends, strict=True):
                taken[i] = _from_words(packed_rows[:, start:stop], leaves[i])
        return jax.tree.unflatten(treedef, taken)

    return take
