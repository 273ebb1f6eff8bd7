"""Unpickle one of gymnax-blines' PPO checkpoints (``agents/<game>/ppo.pkl``) and write its arrays as plain data.

Run by a Python that can unpickle it (flax for its FrozenDict, dotmap for its config), never by ppo_eqx's:

    BLINES_PYTHON bench/peer_runners/read_blines_checkpoint.py agents/SpaceInvaders-MinAtar/ppo.pkl OUT

writes OUT.npz (one array per dense layer's ``kernel`` and ``bias``, named ``layer/kernel``) and OUT.json (the
evaluation log saved beside the weights: ``log_steps``, ``log_return``). Imports numpy only (and, through the
pickle, whatever the pickle names).
"""

import json
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def dense_arrays(params: Mapping) -> dict[str, np.ndarray]:
    """``{"layer/kernel": array, "layer/bias": array}`` from flax's ``{"params": {layer: {kernel, bias}}}``."""
    layers = params["params"]
    return {f"{layer}/{name}": np.asarray(value) for layer in layers for name, value in layers[layer].items()}


def main(argv: list[str]) -> int:
    checkpoint, out = Path(argv[0]), Path(argv[1])
    with checkpoint.open("rb") as file:
        saved = pickle.load(file)
    np.savez(out.with_suffix(".npz"), **dense_arrays(saved["network"]))
    log = {
        "log_steps": [int(step) for step in np.asarray(saved["log_steps"])],
        "log_return": [float(value) for value in np.asarray(saved["log_return"])],
    }
    out.with_suffix(".json").write_text(json.dumps(log))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
