"""Hypothesis strategies. Shapes come from small fixed sets so that jit compiles once per shape."""

import numpy as np
from hypothesis import strategies as st

TIME_ENV_SHAPES = [(1, 1), (5, 3), (16, 4), (32, 2)]
BATCH_SIZES = [1, 7, 64]


def float_arrays(shape: tuple[int, ...], low: float = -10.0, high: float = 10.0) -> st.SearchStrategy[np.ndarray]:
    """Float32 arrays drawn from a seed, so that examples are cheap and shrink well."""
    return st.integers(0, 2**32 - 1).map(
        lambda seed: np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)
    )


def bool_arrays(shape: tuple[int, ...], p: float = 0.2) -> st.SearchStrategy[np.ndarray]:
    return st.integers(0, 2**32 - 1).map(lambda seed: np.random.default_rng(seed).random(shape) < p)


unit_interval = st.floats(0.0, 1.0, allow_nan=False, width=32)
