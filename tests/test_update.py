from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_eqx import ActorCritic, AgentHyperparameters, Batch, PPOConfig, make_optimizer, model_loss, update
from ppo_eqx.core.checks import check_actions
from ppo_eqx.core.minibatch import row_taker
from ppo_eqx.core.update import current_learning_rate, learning_rate_schedule, minibatch_indices

pytestmark = pytest.mark.unit

COEFS: dict[str, Any] = {"clip_coef": 0.1, "vf_coef": 0.5, "ent_coef": 0.01}


def hyperparameters(config: PPOConfig) -> AgentHyperparameters:
    return AgentHyperparameters.of([config])


def make_batch(size: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Batch(
        f32(rng.normal(size=(size, 4))),
        jnp.asarray(rng.integers(0, 2, size), jnp.int32),
        f32(rng.normal(size=size) * 0.1 - 0.7),
        f32(rng.normal(size=size)),
        f32(rng.normal(size=size)),
        f32(rng.normal(size=size)),
    )


def test_each_epoch_is_a_permutation_split_into_minibatches():
    indices = np.asarray(minibatch_indices(24, num_minibatches=3, update_epochs=4, key=jax.random.PRNGKey(0)))
    assert indices.shape == (12, 8)
    for epoch in indices.reshape(4, 24):
        np.testing.assert_array_equal(np.sort(epoch), np.arange(24))
    assert not np.array_equal(indices[:3], indices[3:6])  # a fresh shuffle each epoch


def test_learning_rate_anneals_linearly_per_iteration():
    config = PPOConfig(total_timesteps=4096, num_envs=8, num_steps=128)  # 4 iterations of 16 steps
    schedule = learning_rate_schedule(hyperparameters(config), config.sizes)
    for count, frac in [(0, 1.0), (15, 1.0), (16, 0.75), (47, 0.5), (48, 0.25)]:
        assert float(jnp.asarray(schedule(count))) == pytest.approx(2.5e-4 * frac)
    constant = learning_rate_schedule(hyperparameters(config.replace(anneal_lr=False)), config.sizes)
    assert float(jnp.asarray(constant(40))) == pytest.approx(2.5e-4)


@pytest.mark.compile
def test_one_full_batch_step_equals_a_hand_written_adam_step():
    config = PPOConfig(
        env_id="CartPole-v1",
        total_timesteps=640,
        num_envs=4,
        num_steps=16,
        num_minibatches=1,
        update_epochs=1,
        max_grad_norm=1e6,
        anneal_lr=False,
    )
    model = ActorCritic((4,), 2, key=jax.random.PRNGKey(0))
    batch = make_batch(64)
    settings = hyperparameters(config.replace(**COEFS))
    opt_state = make_optimizer(settings, config.sizes).init(eqx.filter(model, eqx.is_array))
    new_model, _, infos = update(model, opt_state, batch, settings, sizes=config.sizes, key=jax.random.PRNGKey(1))
    # Reference: the loss on the whole (unshuffled) batch, Adam's first step is lr * g / (|g| + eps).
    grads = eqx.filter_grad(lambda m: model_loss(m, batch, settings)[0])(model)
    expected = jax.tree.map(lambda p, g: p - 2.5e-4 * g / (jnp.abs(g) + 1e-5), eqx.filter(model, eqx.is_array), grads)
    for got, want in zip(jax.tree.leaves(eqx.filter(new_model, eqx.is_array)), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert infos.loss.shape == (1,)
    assert float(infos.loss[0]) == pytest.approx(float(model_loss(model, batch, settings)[0]), rel=1e-4, abs=1e-6)


def numpy_clipped_adam(params, grads_per_step, *, max_grad_norm, learning_rate, eps=1e-5, b1=0.9, b2=0.999):
    """Adam (optax's bias-corrected form) on gradients whose global norm is first cut to ``max_grad_norm``."""
    params = {name: np.asarray(p, np.float64) for name, p in params.items()}
    m = {name: np.zeros_like(p) for name, p in params.items()}
    v = {name: np.zeros_like(p) for name, p in params.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in grads.values()))
        scale = min(1.0, max_grad_norm / norm)
        for name, g in grads.items():
            g = np.asarray(g, np.float64) * scale
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g**2
            m_hat, v_hat = m[name] / (1 - b1**t), v[name] / (1 - b2**t)
            params[name] = params[name] - learning_rate * m_hat / (np.sqrt(v_hat) + eps)
    return params


def test_the_optimizer_clips_the_global_norm_at_max_grad_norm_before_adam():
    # Adam's first step is the same for any scale of gradient, its second is not: a large first gradient
    # (norm 10) cut to norm 2 weighs against a small second one (norm 1, not cut) as 2 to 1, not 10 to 1.
    config = PPOConfig(max_grad_norm=2.0, anneal_lr=False)
    params = {"a": jnp.zeros(3), "b": jnp.zeros((2, 2))}  # at zero, float32 keeps the small steps exactly
    rng = np.random.default_rng(0)
    grads_per_step = []
    for norm in (10.0, 1.0):
        grads = {name: rng.normal(size=p.shape) for name, p in params.items()}
        total = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
        grads_per_step.append({name: jnp.asarray(g * norm / total, jnp.float32) for name, g in grads.items()})
    optimizer = make_optimizer(hyperparameters(config), config.sizes)
    state = optimizer.init(params)
    got = params
    for grads in grads_per_step:
        updates, state = optimizer.update(grads, state, got)
        got = optax.apply_updates(got, updates)
    want = numpy_clipped_adam(params, grads_per_step, max_grad_norm=2.0, learning_rate=config.learning_rate)
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-9)  # pyright: ignore
    unclipped = numpy_clipped_adam(params, grads_per_step, max_grad_norm=np.inf, learning_rate=config.learning_rate)
    assert not np.allclose(want["a"], unclipped["a"], rtol=1e-2, atol=0)  # the test can tell
    learning_rate = current_learning_rate(state)
    assert learning_rate is not None and float(learning_rate) == pytest.approx(config.learning_rate)


@pytest.mark.compile
def test_a_partly_unrolled_scan_gives_the_same_update():
    # 6 minibatch steps unrolled 4 at a time: one unrolled block and a remainder.
    config = PPOConfig(num_minibatches=2, update_epochs=3)
    model = ActorCritic((4,), 2, key=jax.random.PRNGKey(0))
    batch = make_batch(32, seed=3)
    settings = hyperparameters(config)
    opt_state = make_optimizer(settings, config.sizes).init(eqx.filter(model, eqx.is_array))

    def run(unroll):
        sizes = config.replace(minibatch_unroll=unroll).sizes
        return eqx.filter_jit(update)(model, opt_state, batch, settings, sizes=sizes, key=jax.random.PRNGKey(2))

    plain, _, plain_info = run(1)
    unrolled, _, unrolled_info = run(4)
    for a, b in zip(
        jax.tree.leaves(eqx.filter(plain, eqx.is_array)),
        jax.tree.leaves(eqx.filter(unrolled, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain_info.loss, unrolled_info.loss, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_actions_closed_over_in_a_jitted_function_are_checked_on_the_host():
    # A concrete array captured by a jitted function: a jax method on it there would be staged (a tracer), so
    # the check reads it with NumPy, and still names an action out of range.
    good, bad = jnp.asarray([0, 1, 1]), jnp.asarray([0, 1, 5])
    assert jax.jit(lambda x: (check_actions(good, 2, "f"), x)[1])(1.0) == 1.0
    with pytest.raises(ValueError, match="holds 5; allowed: 0 .. 1"):
        jax.jit(lambda x: (check_actions(bad, 2, "f"), x)[1])(1.0)


@given(
    rows=st.integers(2, 40),
    width=st.integers(1, 70),
    wide=st.booleans(),
    seed=st.integers(0, 2**16),
    small_as_words=st.booleans(),
)
@settings(max_examples=25, deadline=None)
def test_row_taker_takes_each_fields_rows_bit_for_bit(
    rows: int, width: int, wide: bool, seed: int, small_as_words: bool
) -> None:
    """The packed gather gives each field's own rows, bits and dtypes unchanged: NaN, -0.0 and int32 actions
    included; bytes and bfloat16 whose rows are whole words, packed or (too wide) taken as words on their own; rows
    of bytes that are not whole words, and a bool field, taken on their own."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(rows).astype(np.float32)
    values[0], values[-1] = np.nan, -0.0
    fields = {
        "obs": rng.standard_normal((rows, width)).astype(np.float32),
        "actions": rng.integers(-(2**31), 2**31 - 1, rows, dtype=np.int32),
        "values": values,
        "frames": rng.integers(0, 255, (rows, 3, 5) if wide else (rows, 2), dtype=np.uint8),
        "words_of_bytes": rng.integers(0, 255, (rows, 4, 6) if wide else (rows, 4), dtype=np.uint8),
        "grid": rng.standard_normal((rows, 10, 10, 4) if wide else (rows, 3, 2)).astype(jnp.bfloat16),
        "done": rng.random(rows) < 0.5,
    }
    index = rng.permutation(rows)[: max(1, rows // 2)].astype(np.int32)
    taken = jax.jit(lambda batch, i: row_taker(batch, small_as_words=small_as_words)(i))(fields, index)
    for name, field in fields.items():
        want = field[index]
        assert taken[name].dtype == field.dtype and taken[name].shape == want.shape, name
        assert np.asarray(taken[name]).tobytes() == want.tobytes(), name


def _batch_of(obs: jax.Array) -> Batch:
    """A Batch of ``obs`` with zeros in its five narrow fields."""
    rows = obs.shape[0]
    zeros = jnp.zeros(rows)
    return Batch(
        obs=obs, actions=jnp.zeros(rows, jnp.int32), logprobs=zeros, values=zeros, advantages=zeros, returns=zeros
    )


def _gathered(batch: Batch, **options: Any) -> list[tuple[str, tuple[int, ...]]]:
    """The dtype and shape of what each gather of a minibatch of 8 rows takes from."""
    jaxpr = jax.make_jaxpr(lambda i: row_taker(batch, **options)(i))(jnp.arange(8, dtype=jnp.int32))
    return [
        (str(e.invars[0].aval.dtype), e.invars[0].aval.shape)
        for e in _equations(jaxpr.jaxpr)
        if e.primitive.name == "gather"
    ]


def test_row_taker_gathers_the_narrow_fields_once() -> None:
    """A Batch of frames takes two gathers a minibatch (the frames', the five packed fields'), not six."""
    assert len(_gathered(_batch_of(jnp.zeros((32, 4, 84, 84), jnp.uint8)))) == 2


def test_row_taker_gathers_rows_of_words() -> None:
    """Off the CPU, every gather takes rows of one flat run of uint32 words (a TPU gathered MinAtar's [rows, 10, 10,
    4] bfloat16 grids in a layout 60 times slower): the grids' own gather and the packed one, each of a 2-D operand;
    on a CPU the grids' rows are flattened, in their own type."""
    batch = _batch_of(jnp.zeros((32, 10, 10, 4), jnp.bfloat16))
    assert _gathered(batch, small_as_words=True) == [("uint32", (32, 200)), ("uint32", (32, 5))]
    assert _gathered(batch, small_as_words=False) == [("bfloat16", (32, 400)), ("uint32", (32, 5))]


def _equations(jaxpr: Any) -> list[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs inside it (``jnp.take`` is a jitted call of its own)."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                found += _equations(inner)
    return found
