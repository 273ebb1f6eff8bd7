"""The library checks its inputs at run time, for a user's script, not only under pytest (issue 23).

pytest checks shapes and dtypes through jaxtyping's import hook (``--jaxtyping-packages`` in pyproject's
addopts); a user importing ppo_eqx has no hook. So every call here runs in a process of its own
(``library_calls.py``, one process for the whole table), and a bad call must raise an error that names the
argument, at trace time: under ``jax.jit`` too, with nothing left to check when the compiled code runs.
"""

import json
import re

import pytest

from .processes import ROOT, run_child

pytestmark = pytest.mark.subprocess

ISSUE = pytest.mark.xfail(strict=True, reason="issue 23")

# name -> (a call, in library_calls.py's names, and the words of which the error must hold one: the argument's name)
BAD = {
    # compute_gae(rewards [T N], values [T N], dones [T N] bool, last_value [N], *, gamma, gae_lambda)
    "gae-rewards-of-rank-1": ("gae(rewards=f32(T))", ("rewards",)),
    "gae-rewards-int32": ("gae(rewards=i32(T, N))", ("rewards",)),
    "gae-values-of-other-envs": ("gae(values=f32(T, N + 1))", ("values",)),
    "gae-values-of-other-steps": ("gae(values=f32(T - 1, N))", ("values",)),
    "gae-dones-float": ("gae(dones=f32(T, N))", ("dones",)),
    "gae-dones-int32": ("gae(dones=i32(T, N))", ("dones",)),
    "gae-dones-of-other-steps": ("gae(dones=no(T - 1, N))", ("dones",)),
    "gae-last-value-N-1": ("gae(last_value=f32(N, 1))", ("last_value",)),
    "gae-last-value-of-other-envs": ("gae(last_value=f32(N + 1))", ("last_value",)),
    "gae-last-value-scalar": ("gae(last_value=f32())", ("last_value",)),
    "gae-gamma-per-env": ("gae(gamma=f32(N))", ("gamma",)),
    "gae-gae-lambda-a-string": ("gae(gae_lambda='0.95')", ("gae_lambda",)),
    "gae-jitted-dones-float": ("jax.jit(lambda d: gae(dones=d))(f32(T, N))", ("dones",)),
    "gae-jitted-last-value-N-1": ("jax.jit(lambda v: gae(last_value=v))(f32(N, 1))", ("last_value",)),
    # ppo_loss(new_logprob, new_value, entropy, old_logprob, old_value, advantages, returns: [B], hyperparameters),
    # the hyperparameters one agent's AgentHyperparameters (scalars); loss(NAME=...) replaces one of their fields
    "loss-new-value-B-1": ("loss(new_value=f32(B, 1))", ("new_value",)),
    "loss-returns-B-1": ("loss(returns=f32(B, 1))", ("returns",)),
    "loss-advantages-B-1": ("loss(advantages=f32(B, 1))", ("advantages",)),
    "loss-entropy-B-1": ("loss(entropy=f32(B, 1))", ("entropy",)),
    "loss-old-value-B-1-clipped": ("loss(old_value=f32(B, 1), clip_vloss=True)", ("old_value",)),
    "loss-new-logprob-longer": ("loss(new_logprob=f32(B + 1))", ("new_logprob",)),
    "loss-old-logprob-shorter": ("loss(old_logprob=f32(B - 1))", ("old_logprob",)),
    "loss-new-logprob-scalar": ("loss(new_logprob=f32())", ("new_logprob",)),
    "loss-old-logprob-int32": ("loss(old_logprob=i32(B))", ("old_logprob",)),
    "loss-returns-bool": ("loss(returns=no(B))", ("returns",)),
    "loss-clip-coef-per-sample": ("loss(clip_coef=f32(2))", ("clip_coef",)),
    "loss-vf-coef-a-string": ("loss(vf_coef='0.5')", ("vf_coef",)),
    "loss-norm-adv-a-string": ("loss(norm_adv='yes')", ("norm_adv",)),
    "loss-jitted-new-value-B-1": ("jax.jit(lambda v: loss(new_value=v))(f32(B, 1))", ("new_value",)),
    # ActorCritic(obs_shape, num_actions, *, conv_impl, key)
    "model-conv-impl-bogus-vectors": ("ActorCritic((D,), A, conv_impl='bogus', key=KEY)", ("conv_impl",)),
    "model-conv-impl-bogus-frames": ("ActorCritic((4, 84, 84), A, conv_impl='bogus', key=KEY)", ("conv_impl",)),
    "model-obs-shape-of-rank-2": ("ActorCritic((2, 3), A, key=KEY)", ("obs_shape", "observation shape")),
    "model-frames-too-small": ("ActorCritic((4, 20, 20), A, conv_impl='matmul', key=KEY)", ("obs_shape",)),
    "model-no-actions": ("ActorCritic((D,), 0, key=KEY)", ("num_actions",)),
    "model-negative-actions": ("ActorCritic((D,), -1, key=KEY)", ("num_actions",)),
    "model-key-an-int": ("ActorCritic((D,), A, key=0)", ("key",)),
    # ActorCritic.__call__(obs [B *obs]) and .evaluate_actions(obs, actions [B] int32 in 0 .. A-1)
    "call-vector-obs-without-batch": ("vector_model(f32(D))", ("obs",)),
    "call-vector-obs-of-other-size": ("vector_model(f32(B, D + 1))", ("obs",)),
    "call-vector-obs-of-rank-3": ("vector_model(f32(B, D, 1))", ("obs",)),
    "call-frames-channels-last": ("frame_model(jnp.zeros((2, 84, 84, 4), jnp.uint8))", ("obs",)),
    "call-frames-without-batch": ("frame_model(jnp.zeros((4, 84, 84), jnp.uint8))", ("obs",)),
    "call-frames-of-other-channels": ("frame_model(jnp.zeros((2, 3, 84, 84), jnp.uint8))", ("obs",)),
    "call-jitted-vector-obs-of-other-size": ("eqx.filter_jit(vector_model)(f32(B, D + 1))", ("obs",)),
    "actions-out-of-range": ("vector_model.evaluate_actions(f32(B, D), i32(B, value=A))", ("actions",)),
    "actions-negative": ("vector_model.evaluate_actions(f32(B, D), i32(B, value=-1))", ("actions",)),
    "actions-float": ("vector_model.evaluate_actions(f32(B, D), f32(B))", ("actions",)),
    "actions-B-1": ("vector_model.evaluate_actions(f32(B, D), i32(B, 1))", ("actions",)),
    "actions-of-other-length": ("vector_model.evaluate_actions(f32(B, D), i32(B + 1))", ("actions",)),
    # rollout(model, env_step, carry, *, num_steps, key)
    "rollout-carry-obs-of-other-size": ("roll(carry=carry(f32(N, D + 1)))", ("carry", "obs")),
    "rollout-carry-a-tuple": ("roll(carry=(jnp.zeros(N, jnp.int32), f32(N, D)))", ("carry",)),
    "rollout-env-step-not-callable": ("roll(env_step=None)", ("env_step",)),
    "rollout-env-step-of-other-obs": (
        "roll(env_step=lambda h, a: fake_env_step(h, a, obs_size=D + 1))",
        ("env_step", "obs"),
    ),
    "rollout-no-steps": ("roll(num_steps=0)", ("num_steps",)),
    "rollout-negative-steps": ("roll(num_steps=-1)", ("num_steps",)),
    "rollout-key-an-int": ("roll(key=0)", ("key",)),
    # update(model, opt_state, batch, hyperparameters, *, sizes, key); learn(num_minibatches=...) changes sizes
    "update-values-B-1": ("learn(batch=batch(values=f32(B, 1)))", ("values", "batch")),
    "update-returns-shorter": ("learn(batch=batch(returns=f32(B - 1)))", ("returns", "batch")),
    "update-obs-of-other-size": ("learn(batch=batch(obs=f32(B, D + 1)))", ("obs", "batch")),
    "update-actions-float": ("learn(batch=batch(actions=f32(B)))", ("actions", "batch")),
    "update-actions-out-of-range": ("learn(batch=batch(actions=i32(B, value=A)))", ("actions",)),
    "update-minibatches-not-dividing": ("learn(num_minibatches=3)", ("num_minibatches",)),
    "update-no-minibatches": ("learn(num_minibatches=0)", ("num_minibatches",)),
    "update-no-epochs": ("learn(update_epochs=0)", ("update_epochs",)),
    "update-key-an-int": ("learn(key=0)", ("key",)),
    "update-jitted-values-B-1": (
        "eqx.filter_jit(lambda b: learn(batch=b))(batch(values=f32(B, 1)))",
        ("values", "batch"),
    ),
    # make_iteration(collector, sizes)
    "iteration-sizes-a-dict": ("iteration(sizes={'num_steps': T})", ("sizes",)),
    "iteration-collector-a-string": ("iteration(collector='adam')", ("collector",)),
}
# name -> a call that must return (each checks its result with expect(...))
GOOD = {
    "gae": "expect(gae()[0].shape == (T, N), 'advantages [T, N]')",
    "gae-gamma-an-array": "gae(gamma=jnp.asarray(0.99), gae_lambda=jnp.asarray(0.95))",
    "gae-jitted": "jax.jit(lambda r: gae(rewards=r))(f32(T, N))",
    "loss": "expect(loss()[0].shape == (), 'a scalar loss')",
    "loss-value-loss-0-when-values-are-returns": "expect(value_loss_when_values_are_the_returns(f32(B), f32(B)) == 0, "
    "'0')",
    "loss-flags-as-arrays": "loss(norm_adv=jnp.asarray(False), clip_vloss=jnp.asarray(True))",
    "model-vectors": "expect(vector_model(f32(B, D))[0].shape == (B, A), 'logits [B, A]')",
    "model-frames": "expect(frame_model(frames)[1].shape == (2,), 'values [B]')",
    "actions-in-range": "vector_model.evaluate_actions(f32(B, D), i32(B, value=A - 1))",
    "rollout": "expect(roll()[1].obs.shape == (T, N, D), 'obs [T, N, D]')",
    "update": "learn()",
    "iteration": "expect(callable(iteration()), 'a function')",
    "no-run-time-check-in-jitted-loss": "expect(callbacks_in(lambda v: loss(new_value=v), f32(B)) == [], 'none')",
    "no-run-time-check-in-jitted-model": "expect(callbacks_in(vector_model, f32(B, D)) == [], 'no callback')",
    "outside-jaxtypings-import-hook": "expect(not any('jaxtyping' in type(f).__module__ for f in sys.meta_path), "
    "'a jaxtyping import hook is installed')",
}
PASSING_TODAY = {
    "model-obs-shape-of-rank-2",
    # refused since the design pass (issue 24): the route is checked, the model keeps its obs_shape
    "model-conv-impl-bogus-vectors",
    "model-conv-impl-bogus-frames",
    "call-vector-obs-without-batch",
    "call-vector-obs-of-other-size",
    "call-vector-obs-of-rank-3",
    "call-frames-channels-last",
    "call-frames-without-batch",
    "call-frames-of-other-channels",
    "call-jitted-vector-obs-of-other-size",
    "rollout-carry-obs-of-other-size",
}
"""Bad calls that the code already refuses naming the argument (1a886d4: the first; 3367301: all): regression
cases, not marked."""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every call of ``BAD`` and ``GOOD``, made by library_calls.py in a process of its own."""
    directory = tmp_path_factory.mktemp("library_calls")
    cases = directory / "cases.json"
    cases.write_text(json.dumps({**{name: call for name, (call, _) in BAD.items()}, **GOOD}))
    out = directory / "results.json"
    code, stdout, stderr = run_child([str(ROOT / "tests" / "library_calls.py"), str(cases), str(out)])
    assert code == 0, stdout + stderr
    return json.loads(out.read_text())


def names(message: str, words: tuple[str, ...]) -> bool:
    """Whether ``message`` names one of ``words`` as a word (``values``, not ``new_values``'s part)."""
    return any(re.search(rf"(?<!\w){re.escape(word)}(?!\w)", message) for word in words)


DEEP = ("/jax/", "/jaxlib/", "/equinox/", "/optax/", "/numpy/")
"""Where an error raised by jax's own machinery comes from: it may name a word of the argument's ("got values
with different leading axis sizes") without being a check of it."""


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in PASSING_TODAY else ISSUE) for name in BAD])
def test_a_bad_call_raises_an_error_naming_the_argument(results: dict[str, dict], name: str) -> None:
    result, (_, words) = results[name], BAD[name]
    assert result["raised"] is not None, "returned without an error"
    shown = f"{result['raised']}: {result['message'][:600]} (raised at {result['where']})"
    assert not any(part in result["where"] for part in DEEP), shown
    assert names(result["message"], words), shown


@pytest.mark.parametrize("name", list(GOOD))
def test_a_good_call_still_works(results: dict[str, dict], name: str) -> None:
    assert results[name]["raised"] is None, results[name]
