"""A process that trains many times (a notebook, the test suite) keeps nothing of the trainers it closed (issue 32).

The README's test command, one pytest process, aborted at 97% inside XLA's compile: every compiled program of
every trainer was still held (by equinox's and jax's caches, through the closures they were given), a few hundred
memory maps each, until the process reached Linux's limit (``vm.max_map_count``, 65,530) and the next mmap of a
compile failed. And no EnvPool pool was ever freed, three threads each. Here each trainer's programs, pools and
threads must go with it: after the first few trainers (whatever jax keeps once per process), more trainers add
nothing that grows with their number.
"""

import gc
import os
from pathlib import Path

import jax
import pytest
from envpool.python.envpool import EnvPoolMixin

import ppo_eqx

pytestmark = pytest.mark.envpool

SELF = Path(f"/proc/{os.getpid()}")
TRAINERS = 3
PER_TRAINER_BEFORE = 1100
"""Memory maps that each CartPole trainer left behind before the fix (2026-12-04, jax 0.10.2, 2-core EPYC)."""


def maps() -> int:
    return len((SELF / "maps").read_text().splitlines())


def threads() -> int:
    return len(list((SELF / "task").iterdir()))


def pools() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, EnvPoolMixin) and not isinstance(o, type))


def train_and_evaluate_once(config: ppo_eqx.PPOConfig) -> None:
    with ppo_eqx.Trainer(config) as trainer:
        list(ppo_eqx.run(trainer))
        model = trainer.checkpoint().model
    ppo_eqx.evaluate(model, config, episodes=2, seed=1, key=jax.random.key(0))
    gc.collect()


@pytest.mark.skipif(not SELF.is_dir(), reason="reads /proc (Linux)")
def test_trainers_that_are_closed_leave_no_programs_pools_or_threads() -> None:
    # Two segments of envs (each a pool and a program of its own) and an evaluation per trainer.
    config = ppo_eqx.PPOConfig.for_task("CartPole-v1", total_timesteps=4 * 512, checkpoint_every=2)
    for _ in range(1):  # what a first trainer leaves once per process (jax's own caches, imports)
        train_and_evaluate_once(config)
    before = maps(), threads(), pools()
    for _ in range(TRAINERS):
        train_and_evaluate_once(config)
    after = maps(), threads(), pools()
    grown = [b - a for a, b in zip(before, after, strict=True)]
    # A few maps may come and go with the allocator; a leak is a few hundred per trainer.
    assert grown[0] < PER_TRAINER_BEFORE // 10, f"memory maps grew by {grown[0]} over {TRAINERS} trainers"
    assert grown[1] <= 0, f"threads grew by {grown[1]} over {TRAINERS} trainers"
    assert grown[2] <= 0, f"{grown[2]} more EnvPool pools alive after {TRAINERS} closed trainers"
