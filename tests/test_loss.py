import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ppo_eqx import AgentHyperparameters, Hyperparameters, ppo_loss
from ppo_eqx.core.networks import categorical_logprob_entropy

from .strategies import BATCH_SIZES, float_arrays

pytestmark = pytest.mark.unit

loss_fn = jax.jit(ppo_loss)
COEFS: dict[str, Any] = {"clip_coef": 0.1, "vf_coef": 0.5, "ent_coef": 0.01}


def settings(**values: Any) -> AgentHyperparameters:
    """One agent's hyperparameters as the loss takes them: CleanRL's, less ``values``."""
    return AgentHyperparameters.of([Hyperparameters(**values)])


def reference_loss(
    new_logprob,
    new_value,
    entropy,
    old_logprob,
    old_value,
    advantages,
    returns,
    *,
    clip_coef,
    vf_coef,
    ent_coef,
    norm_adv,
    clip_vloss,
):
    """CleanRL's arithmetic written out element by element in float64."""
    new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns = (
        np.asarray(x, np.float64)
        for x in (new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns)
    )
    size = len(advantages)
    if norm_adv:
        mean = sum(advantages) / size
        std = math.sqrt(sum((a - mean) ** 2 for a in advantages) / size)
        advantages = (advantages - mean) / (std + 1e-8)
    policy, value, kl, clipped = 0.0, 0.0, 0.0, 0.0
    for i in range(size):
        ratio = math.exp(new_logprob[i] - old_logprob[i])
        clipped_ratio = min(max(ratio, 1 - clip_coef), 1 + clip_coef)
        policy += max(-advantages[i] * ratio, -advantages[i] * clipped_ratio) / size
        error = (new_value[i] - returns[i]) ** 2
        if clip_vloss:
            v = old_value[i] + min(max(new_value[i] - old_value[i], -clip_coef), clip_coef)
            error = max(error, (v - returns[i]) ** 2)
        value += 0.5 * error / size
        kl += ((ratio - 1) - (new_logprob[i] - old_logprob[i])) / size
        clipped += (abs(ratio - 1) > clip_coef) / size
    ent = float(np.mean(entropy))
    return policy - ent_coef * ent + vf_coef * value, policy, value, ent, kl, clipped


@st.composite
def loss_inputs(draw):
    size = draw(st.sampled_from(BATCH_SIZES[1:]))
    old_logprob = draw(float_arrays((size,), -3.0, -0.01))
    shift = draw(float_arrays((size,), -0.3, 0.3))
    return (
        old_logprob + shift,
        draw(float_arrays((size,))),
        draw(float_arrays((size,), 0.0, 1.5)),
        old_logprob,
        draw(float_arrays((size,))),
        draw(float_arrays((size,))),
        draw(float_arrays((size,))),
    )


@given(loss_inputs(), st.booleans(), st.booleans(), st.sampled_from([0.1, 0.2]))
def test_matches_reference(inputs, norm_adv, clip_vloss, clip_coef):
    coefs = {**COEFS, "clip_coef": clip_coef}
    loss, info = loss_fn(*map(jnp.asarray, inputs), settings(**coefs, norm_adv=norm_adv, clip_vloss=clip_vloss))
    expected = reference_loss(*inputs, **coefs, norm_adv=norm_adv, clip_vloss=clip_vloss)
    got = (loss, info.policy_loss, info.value_loss, info.entropy, info.approx_kl)
    np.testing.assert_allclose(np.array(got, np.float64), np.array(expected[:5]), rtol=2e-4, atol=2e-4)
    # A ratio within float32 rounding of the clip boundary may be counted either way.
    assert abs(float(info.clip_fraction) - expected[5]) <= 1.0 / len(inputs[0]) + 1e-6
    assert float(info.loss) == pytest.approx(float(loss))


@given(loss_inputs(), st.booleans())
def test_ratio_one_makes_clipped_and_unclipped_equal(inputs, norm_adv):
    _, new_value, entropy, old_logprob, old_value, advantages, returns = map(jnp.asarray, inputs)
    _, info = loss_fn(
        old_logprob,
        new_value,
        entropy,
        old_logprob,
        old_value,
        advantages,
        returns,
        settings(**COEFS, norm_adv=norm_adv),
    )
    a = np.asarray(advantages, np.float64)
    if norm_adv:
        a = (a - a.mean()) / (a.std() + 1e-8)
    # At ratio 1 the clipped objective is the plain one: -mean(A).
    assert float(info.policy_loss) == pytest.approx(-a.mean(), abs=1e-5)
    assert float(info.approx_kl) == 0.0
    assert float(info.clip_fraction) == 0.0


@given(loss_inputs())
def test_value_loss_is_half_the_mean_squared_error_and_clipping_never_lowers_it(inputs):
    new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns = map(jnp.asarray, inputs)

    def value_loss(values, *, clip_vloss):
        hyperparameters = settings(**COEFS, clip_vloss=clip_vloss)
        _, info = loss_fn(new_logprob, values, entropy, old_logprob, old_value, advantages, returns, hyperparameters)
        return float(info.value_loss)

    errors = np.asarray(new_value, np.float64) - np.asarray(returns, np.float64)
    unclipped = value_loss(new_value, clip_vloss=False)
    assert unclipped == pytest.approx(0.5 * np.mean(errors**2), rel=1e-5, abs=1e-6)
    assert value_loss(returns, clip_vloss=False) == 0.0  # and it is zero where the values are the returns
    # CleanRL's clipped loss is the larger of the two squared errors, element by element.
    assert value_loss(new_value, clip_vloss=True) >= unclipped * (1 - 1e-6)


@given(loss_inputs())
def test_normalised_advantages_have_mean_zero_and_std_one(inputs):
    _, new_value, entropy, old_logprob, old_value, advantages, returns = map(jnp.asarray, inputs)
    assume(float(jnp.std(advantages)) >= 1e-2)
    # At ratio 1, d policy_loss / d new_logprob[i] = -A_norm[i] / B: read the normalised advantages off it.
    grad = jax.grad(
        lambda lp: (
            ppo_loss(lp, new_value, entropy, old_logprob, old_value, advantages, returns, settings(**COEFS))[
                1
            ].policy_loss
        )
    )(old_logprob)
    normalised = -np.asarray(grad, np.float64) * len(advantages)
    assert normalised.mean() == pytest.approx(0.0, abs=1e-4)
    assert normalised.std() == pytest.approx(1.0, abs=1e-3)


@given(loss_inputs())
def test_policy_gradient_vanishes_where_the_ratio_is_clipped(inputs):
    new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns = map(jnp.asarray, inputs)
    clip = COEFS["clip_coef"]

    def policy_loss(lp):
        hyperparameters = settings(**COEFS, norm_adv=False)
        return ppo_loss(lp, new_value, entropy, old_logprob, old_value, advantages, returns, hyperparameters)[
            1
        ].policy_loss

    grad = np.asarray(jax.grad(policy_loss)(new_logprob))
    ratio = np.exp(np.asarray(new_logprob, np.float64) - np.asarray(old_logprob, np.float64))
    a = np.asarray(advantages)
    margin = 1e-3  # stay clear of float32 rounding at the boundary
    clipped = ((a > 0) & (ratio > 1 + clip + margin)) | ((a < 0) & (ratio < 1 - clip - margin))
    free = (np.abs(ratio - 1) < clip - margin) & (np.abs(a) > 1e-3)
    np.testing.assert_array_equal(grad[clipped], 0.0)
    assert np.all(grad[free] != 0.0)
    np.testing.assert_allclose(grad[free], -a[free] * ratio[free] / len(a), rtol=1e-3)


@pytest.mark.parametrize("num_actions", [2, 4, 18])
def test_uniform_logits_give_entropy_log_a(num_actions):
    logits = jnp.full((5, num_actions), 3.7)
    logprob, entropy = categorical_logprob_entropy(logits, jnp.arange(5, dtype=jnp.int32) % num_actions)
    np.testing.assert_allclose(entropy, math.log(num_actions), rtol=1e-6)
    np.testing.assert_allclose(logprob, -math.log(num_actions), rtol=1e-6)


def test_logprob_matches_numpy_softmax():
    logits = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    actions = np.array([0, 1, 2, 3, 1, 0], np.int32)
    logprob, entropy = categorical_logprob_entropy(jnp.asarray(logits), jnp.asarray(actions))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(logprob, np.log(probs[np.arange(6), actions]), rtol=1e-5)
    np.testing.assert_allclose(entropy, -(probs * np.log(probs)).sum(1), rtol=1e-5)
