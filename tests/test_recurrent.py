"""The recurrent policy (``core.recurrent``, ``--network lstm``; issue 51): the LSTM and the replay of whole
sequences against a NumPy loop, over episode-boundary patterns; the update's replay of what the rollout acted on; the
update on whole env sequences against a gradient step taken by hand; where it cannot run, one line."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ppo_eqx
from ppo_eqx.core._types import SequenceBatch
from ppo_eqx.core.collect import sync_collector
from ppo_eqx.core.networks import MLP
from ppo_eqx.core.recurrent import LSTMActorCritic, LSTMCell, RecurrentPolicy
from ppo_eqx.core.rollout import init_episode_stats
from ppo_eqx.core.update import make_optimizer, sequence_update
from ppo_eqx.errors import ConfigError

from .fake_env import counting_pool

pytestmark = pytest.mark.unit


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def numpy_lstm(cell: LSTMCell, h: np.ndarray, c: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step of torch's ``nn.LSTM`` (gates in, forget, cell, out), in float64."""
    w_i, b_i = np.asarray(cell.inputs.weight, np.float64), np.asarray(cell.inputs.bias, np.float64)
    w_h, b_h = np.asarray(cell.recurrent.weight, np.float64), np.asarray(cell.recurrent.bias, np.float64)
    gates = x @ w_i + b_i + h @ w_h + b_h
    i, f, g, o = np.split(gates, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def numpy_replay(model: LSTMActorCritic, memory, obs, starts, actions):
    """The vector model's log-probabilities, entropies and values of a sequence, step by step in float64: the memory
    set to zeros where an observation starts an episode (CleanRL's ``(1 - done) * state``)."""
    h, c = (np.asarray(x, np.float64) for x in memory)
    weights = lambda layer: (np.asarray(layer.weight, np.float64), np.asarray(layer.bias, np.float64))  # noqa: E731
    logprobs, entropies, values = [], [], []
    for t in range(obs.shape[0]):
        keep = ~starts[t][:, None]
        h, c = h * keep, c * keep
        w, b = weights(model.embedding)
        x = np.maximum(np.asarray(obs[t], np.float64) @ w + b, 0)
        h, c = numpy_lstm(model.lstm, h, c, x)
        heads = []
        for mlp in (model.actor, model.critic):
            assert isinstance(mlp, MLP)
            y = h
            for layer in mlp.layers[:-1]:
                w, b = weights(layer)
                y = np.maximum(y @ w + b, 0)
            w, b = weights(mlp.layers[-1])
            heads.append(y @ w + b)
        logits, value = heads
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs = log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True))
        logprobs.append(np.take_along_axis(log_probs, actions[t][:, None], 1)[:, 0])
        entropies.append(-(np.exp(log_probs) * log_probs).sum(-1))
        values.append(value[:, 0])
    return np.stack(logprobs), np.stack(entropies), np.stack(values)


def _model(num_actions: int = 3) -> LSTMActorCritic:
    return LSTMActorCritic((5,), num_actions, kind="vector", key=jax.random.key(0))


def test_the_lstm_cell_is_torchs() -> None:
    cell = LSTMCell(6, 4, key=jax.random.key(1))
    # Orthogonal weights, zero biases (CleanRL's start): perturb the biases so that they count in the comparison.
    cell = eqx.tree_at(lambda m: (m.inputs.bias, m.recurrent.bias), cell, (jnp.arange(16.0) / 30, -jnp.ones(16) / 7))
    rng = np.random.default_rng(0)
    h, c, x = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 6))
    got = cell((jnp.asarray(h, jnp.float32), jnp.asarray(c, jnp.float32)), jnp.asarray(x, jnp.float32))
    want = numpy_lstm(cell, h, c, x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6)
    weight = np.asarray(LSTMCell(6, 4, key=jax.random.key(2)).inputs.weight)
    np.testing.assert_allclose(weight.T @ weight if weight.shape[0] > weight.shape[1] else weight @ weight.T,
                               np.eye(min(weight.shape)), atol=1e-5)  # fmt: skip


@settings(max_examples=25)
@given(st.lists(st.booleans(), min_size=6 * 3, max_size=6 * 3), st.integers(0, 2**16))
def test_a_replayed_sequence_is_the_numpy_loop_for_any_episode_boundaries(flags: list[bool], seed: int) -> None:
    model = _model()
    rng = np.random.default_rng(seed)
    starts = np.asarray(flags).reshape(6, 3)
    obs = rng.normal(size=(6, 3, 5)).astype(np.float32)
    actions = rng.integers(0, 3, size=(6, 3)).astype(np.int32)
    memory = tuple(rng.normal(size=(3, 128)).astype(np.float32) for _ in range(2))
    got = model.evaluate_sequences(
        tuple(map(jnp.asarray, memory)), jnp.asarray(obs), jnp.asarray(starts), jnp.asarray(actions)
    )
    for a, b in zip(got, numpy_replay(model, memory, obs, starts, actions), strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5)


def _rollout_batch(num_envs: int = 4, num_steps: int = 13) -> tuple[RecurrentPolicy, SequenceBatch]:
    model = LSTMActorCritic((4,), 2, kind="vector", key=jax.random.key(3))
    # The counting env: env n's episodes end every n + 2 steps, so each env's boundaries fall elsewhere.
    collector = sync_collector(counting_pool(num_envs), num_steps=num_steps, memory=model.initial_memory)
    carry = collector.carry(init_episode_stats(num_envs))
    collect = eqx.filter_jit(collector.collect)
    carry, _ = collect(model, carry, jax.random.key(4), gamma=0.99, gae_lambda=0.95)  # memories mid-episode
    _, batch = collect(model, carry, jax.random.key(5), gamma=0.99, gae_lambda=0.95)
    assert isinstance(batch, SequenceBatch)
    return model, batch


@pytest.mark.compile
def test_the_replay_gives_what_the_rollout_acted_on() -> None:
    model, batch = _rollout_batch()
    assert batch.starts[0].tolist() == [False] * 4 and batch.starts.any()  # goes on from the last rollout's memory
    logprob, _, value = model.evaluate_sequences(batch.memory, batch.obs, batch.starts, batch.actions)
    np.testing.assert_allclose(np.asarray(logprob), np.asarray(batch.logprobs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(value), np.asarray(batch.values), rtol=1e-5, atol=1e-6)
    # Replayed without the episode boundaries, it is another sequence: the test can tell.
    wrong, _, _ = model.evaluate_sequences(batch.memory, batch.obs, jnp.zeros_like(batch.starts), batch.actions)
    assert not np.allclose(np.asarray(wrong), np.asarray(batch.logprobs), atol=1e-4)


@pytest.mark.compile
def test_the_sequence_update_is_a_gradient_step_on_whole_sequences() -> None:
    model, batch = _rollout_batch()
    config = ppo_eqx.PPOConfig(num_envs=4, num_steps=13, num_minibatches=1, update_epochs=1, network="lstm")
    hyperparameters = config.agent_hyperparameters()
    optimizer = make_optimizer(hyperparameters, config.sizes)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    updated, _, infos = sequence_update(
        model, opt_state, batch, hyperparameters, sizes=config.sizes, key=jax.random.key(6)
    )
    # By hand: the loss of the whole batch (one minibatch of all envs; their order does not change a mean).
    grads = eqx.filter_grad(lambda m: ppo_eqx.model_loss(m, batch, hyperparameters)[0])(model)
    updates, _ = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    by_hand = eqx.apply_updates(model, updates)
    for a, b in zip(jax.tree.leaves(eqx.filter(updated, eqx.is_array)), jax.tree.leaves(by_hand), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert infos.loss.shape == (1,)
    with pytest.raises(ValueError, match="must divide the 4 envs"):
        three = config.sizes._replace(num_minibatches=3)
        sequence_update(model, opt_state, batch, hyperparameters, sizes=three, key=jax.random.key(6))


def test_a_recurrent_model_at_an_episodes_start_is_its_first_step() -> None:
    model = _model()
    obs = jnp.ones((2, 5))
    outputs, values = model(obs)
    memory = (jnp.full((2, 128), 9.0), jnp.full((2, 128), 9.0))  # any memory: reset before the first step
    _, step_outputs, step_values = model.step(memory, obs, jnp.ones((2,), bool))
    np.testing.assert_array_equal(np.asarray(outputs), np.asarray(step_outputs))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(step_values))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"num_envs": 6, "num_minibatches": 4}, "num_minibatches=4 must divide num_envs=6"),
        ({"bootstrap_truncated": True}, "bootstrap_truncated=True be False"),
    ],
)
def test_lstm_settings_it_cannot_learn_with_are_refused(extra: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        ppo_eqx.PPOConfig(network="lstm", **extra).validate()


def test_optax_state_of_the_lstm_is_the_default_optimizers() -> None:
    model = _model()
    state = make_optimizer(ppo_eqx.PPOConfig().agent_hyperparameters(), ppo_eqx.PPOConfig().sizes).init(
        eqx.filter(model, eqx.is_array)
    )
    assert isinstance(state, tuple) and any(isinstance(s, optax.ScaleByAdamState) for s in jax.tree.leaves(
        state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)))  # fmt: skip
