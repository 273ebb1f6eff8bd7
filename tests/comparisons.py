"""How tests compare runs: trees of arrays bit for bit, and a many-seed run against its single-seed runs."""

import equinox as eqx
import jax
import numpy as np

# vmapped matmuls are batched differently by XLA, so sums are accumulated in another order: agent s differs
# from the single-seed run by float32 rounding, which training then carries on (see README, "Many seeds").
RTOL, ATOL = 1e-4, 1e-5
PARAM_ATOL = 1e-6


def leaves_equal(a, b) -> bool:
    a, b = jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array))
    return len(a) == len(b) and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True)
    )
