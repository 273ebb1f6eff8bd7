"""bench/minatar_checkpoints.py: gymnax-blines' checkpoint arrays read by a Python of their own, loaded into the
grid network (checked against a NumPy forward pass of their network), and played."""

import importlib.util
import json
import pickle
import sys
from pathlib import Path
from types import ModuleType

import jax.numpy as jnp
import numpy as np
import pytest

from .bench_scripts import load_bench_script

OBS, ACTIONS = (10, 10, 4), 3  # Breakout-MinAtar's


@pytest.fixture(scope="module")
def mc() -> ModuleType:
    return load_bench_script("minatar_checkpoints")


def blines_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under gymnax-blines' names and shapes (flax: kernel ``[in, out]``)."""
    rng = np.random.default_rng(seed)
    width = int(np.prod(OBS))
    shapes = {
        "Dense_0": (width, 256),
        "Dense_1": (256, 256),
        "Dense_2": (256, ACTIONS),
        "critic_fc_1": (width, 256),
        "critic_fc_2": (256, 256),
        "critic_fc_v": (256, 1),
    }
    arrays = {}
    for name, (fan_in, fan_out) in shapes.items():
        arrays[f"{name}/kernel"] = rng.normal(0, fan_in**-0.5, (fan_in, fan_out)).astype(np.float32)
        arrays[f"{name}/bias"] = rng.uniform(0, 0.05, fan_out).astype(np.float32)
    return arrays


def numpy_forward(arrays: dict[str, np.ndarray], obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gymnax-blines' CategoricalSeparateMLP in NumPy: flatten, two ReLU layers, a linear head, for each part."""
    x = obs.reshape(obs.shape[0], -1).astype(np.float64)

    def mlp(names: tuple[str, str, str]) -> np.ndarray:
        h = x
        for name in names[:2]:
            h = np.maximum(h @ arrays[f"{name}/kernel"] + arrays[f"{name}/bias"], 0.0)
        return h @ arrays[f"{names[2]}/kernel"] + arrays[f"{names[2]}/bias"]

    return mlp(("Dense_0", "Dense_1", "Dense_2")), mlp(("critic_fc_1", "critic_fc_2", "critic_fc_v"))[:, 0]


@pytest.mark.unit
def test_their_weights_in_the_grid_network_compute_their_networks_outputs(mc: ModuleType) -> None:
    arrays = blines_arrays()
    obs = (np.random.default_rng(1).uniform(size=(5, *OBS)) < 0.2).astype(np.float32)
    logits, values = mc.blines_model(arrays, OBS, ACTIONS)(jnp.asarray(obs))
    want_logits, want_values = numpy_forward(arrays, obs)
    np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(values), want_values, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_a_layer_of_another_shape_is_refused_in_one_line(mc: ModuleType) -> None:
    arrays = blines_arrays()
    arrays["Dense_2/kernel"] = arrays["Dense_2/kernel"][:, :2]
    with pytest.raises(
        mc.CheckpointError, match=r"^Dense_2's weight is of shape \[256, 2\]; allowed: shape \[256, 3\]"
    ):
        mc.blines_model(arrays, OBS, ACTIONS)
    del arrays["critic_fc_v/bias"]
    arrays["Dense_2/kernel"] = blines_arrays()["Dense_2/kernel"]
    with pytest.raises(mc.CheckpointError, match=r"^critic_fc_v's bias is missing; allowed: shape \[1\]"):
        mc.blines_model(arrays, OBS, ACTIONS)


def write_checkout(root: Path, arrays: dict[str, np.ndarray]) -> Path:
    """A gymnax-blines checkout holding one checkpoint, pickled as plain dicts (theirs holds flax's FrozenDict,
    a Mapping read the same way)."""
    layers: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        layer, name = key.split("/")
        layers.setdefault(layer, {})[name] = value
    saved = {"network": {"params": layers}, "log_steps": [320_000, 9_919_936], "log_return": [3.5, 22.9]}
    (root / "agents" / "Breakout-MinAtar").mkdir(parents=True)
    (root / "agents" / "Breakout-MinAtar" / "ppo.pkl").write_bytes(pickle.dumps(saved))
    return root


@pytest.mark.subprocess
def test_the_reader_runs_in_another_python_and_returns_the_arrays_and_log(mc: ModuleType, tmp_path: Path) -> None:
    arrays = blines_arrays()
    checkout = write_checkout(tmp_path / "blines", arrays)
    weights, log = mc.read_checkpoint(
        checkout / "agents" / "Breakout-MinAtar" / "ppo.pkl", Path(sys.executable), tmp_path
    )
    assert sorted(weights) == sorted(arrays) and all(np.array_equal(weights[k], arrays[k]) for k in arrays)
    assert log == {"log_steps": [320_000, 9_919_936], "log_return": [3.5, 22.9]}
    (tmp_path / "bad.pkl").write_bytes(b"not a pickle")
    with pytest.raises(mc.CheckpointError, match=r"could not read .*bad\.pkl: "):
        mc.read_checkpoint(tmp_path / "bad.pkl", Path(sys.executable), tmp_path)


@pytest.mark.subprocess
@pytest.mark.skipif(importlib.util.find_spec("gymnax") is None, reason="needs ppo_eqx[gymnax]")
def test_a_checkpoint_is_played_and_reported(mc: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkout = write_checkout(tmp_path / "blines", blines_arrays())
    out = tmp_path / "result.json"
    argv = ["--gymnax-blines", str(checkout), "--blines-python", sys.executable, "--games", "Breakout-MinAtar"]
    assert mc.main([*argv, "--episodes", "2", "--seeds", "1", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["env_id"], row["published_return"], row["checkpoint_log_last_return"]) == (
        "Breakout-MinAtar",
        28.0,
        22.9,
    )
    assert len(row["ppo_eqx_eval_returns"]) == 2 and row["ppo_eqx_eval_mean"] == np.mean(row["ppo_eqx_eval_returns"])
    assert "Breakout-MinAtar: published 28.0" in capsys.readouterr().out
    assert mc.main([*argv[:-1], "Asterix-MinAtar"]) == 1  # no such checkpoint in this checkout: one line
    assert capsys.readouterr().err.strip().endswith("allowed: a game of gymnax-blines' agents/")
