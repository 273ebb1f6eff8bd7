"""Work an accelerator's run does on its host's CPU: what is computed once at a run's start, where a TPU would
compile each program for seconds (docs/performance.md, "One TPU v5e"). No state."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array


def on_the_host_cpu(make: Callable[[], Any], *, platform: str | None = None) -> Any:
    """``make()`` computed on the host's CPU and its arrays put on the default device, where that is an
    accelerator's (``platform``: the default device's, read from jax where not given): a TPU compiles each program
    for seconds (one agent's initialisation took 5.8 s on a TPU v5e, 0.7 s on its host; several agents' are
    operations compiled one by one), and the same seed then starts from the same bits on every platform; an env's
    spec too (``named.backend_and_spec``). On a CPU, or where jax has no CPU backend, ``make()`` as it is."""
    if platform is None:
        target = jax.config.jax_default_device or jax.devices()[0]  # pyright: ignore[reportAttributeAccessIssue]
        platform = target if isinstance(target, str) else target.platform
    if platform == "cpu":
        return make()
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:
        return make()
    with jax.default_device(cpu):
        made = make()
    arrays, rest = eqx.partition(made, eqx.is_array)
    if any(isinstance(x, Tracer) for x in jax.tree.leaves(arrays)):  # traced (eval_shape): no values
        return made
    return eqx.combine(jax.tree.map(_on_the_default_device, arrays), rest)


def _on_the_default_device(x: Array) -> Array:
    """``x`` on the default device as if made there (not committed to it: as the arrays made there before)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jnp.asarray(np.asarray(jax.random.key_data(x)))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return jnp.asarray(np.asarray(x))
