"""Where the rollout runs (``host.placement``; issue 49): ``auto`` never picks a route the device cannot compile
(EnvPool's and ALE's XLA steps are CPU and CUDA calls, so on a TPU their envs run on the host), ``--rollout-on
device`` there is refused in one line naming the routes that work, and host-envs' actors split the envs evenly.
Devices and backends are stand-ins: what is decided is read off their platform, kind and facts alone."""

from typing import Any, NamedTuple

import numpy as np
import pytest

from ppo_eqx import PPOConfig
from ppo_eqx.core.envs import EnvSpec
from ppo_eqx.errors import ConfigError
from ppo_eqx.host import placement
from ppo_eqx.host.host_envs import actor_parts
from ppo_eqx.host.placement import check_rollout_place, compiles_here, default_actor_threads, rollout_place

pytestmark = pytest.mark.unit

ATARI = EnvSpec("Breakout-v5", (4, 84, 84), np.dtype(np.uint8), 4, "frames")
MUJOCO = EnvSpec("Hopper-v4", (11,), np.dtype(np.float32), 3, "vector", None, ((-1.0,) * 3, (1.0,) * 3))


class Device(NamedTuple):
    platform: str
    device_kind: str


CPU, GPU, TPU = Device("cpu", "cpu"), Device("gpu", "NVIDIA H200"), Device("tpu", "TPU v5 lite")
OTHER_TPU = Device("tpu", "TPU v4")  # a kind no measurement names


class _Backend:
    """What placement reads of a backend: its name and facts (EnvPool's, by default)."""

    def __init__(self, name: str = "envpool", compiles_on: Any = ("cpu", "gpu"), host_api: bool = True, data=False):
        self.name, self.rebinds, self.has_async, self.state_is_data = name, False, True, data
        if compiles_on is not None:
            self.compiles_on = compiles_on
        if host_api:
            self.make_host = lambda *args, **kwargs: None

    def spec(self, env_id: str) -> EnvSpec:
        return ATARI

    def make(self, *args: Any, **kwargs: Any) -> Any: ...
    def make_async(self, *args: Any, **kwargs: Any) -> Any: ...


ENVPOOL, ALE, GYMNAX = _Backend(), _Backend("ale", host_api=False), _Backend("gymnax", None, False, data=True)


def test_the_backends_say_where_their_step_compiles() -> None:
    assert compiles_here(ENVPOOL, "cpu") and compiles_here(ENVPOOL, "gpu") and not compiles_here(ENVPOOL, "tpu")
    assert compiles_here(GYMNAX, "tpu")  # says nothing: envs written in JAX compile anywhere


@pytest.mark.parametrize(
    ("backend", "spec", "device", "extra", "place"),
    [
        (ENVPOOL, ATARI, TPU, {}, "host"),  # EnvPool's XLA step cannot be in a TPU program; host measured fastest
        (ENVPOOL, ATARI, OTHER_TPU, {}, "host-envs"),  # unmeasured: host-envs where it runs
        (ENVPOOL, ATARI, OTHER_TPU, {"num_seeds": 2}, "host"),  # host-envs trains one agent: the rollout on the CPU
        (ALE, ATARI, TPU, {}, "host"),  # no host API: the rollout compiled for the host's CPU
        (GYMNAX, ATARI, TPU, {}, "device"),  # the envs are in the program
        (ENVPOOL, ATARI, GPU, {}, "device"),
        (ENVPOOL, ATARI, CPU, {}, "device"),
        (ENVPOOL, ATARI, None, {}, "device"),  # the plan's check, before any device is asked
        (ENVPOOL, MUJOCO, CPU, {}, "host-envs"),  # continuous tasks: host-envs wherever it runs
        (ENVPOOL, ATARI, TPU, {"rollout_on": "host"}, "host"),  # an explicit route is kept
    ],
)
def test_auto_takes_a_route_the_device_can_compile(backend, spec, device, extra, place) -> None:
    config = PPOConfig(**extra).validate()
    assert rollout_place(config, backend, spec, device=device) == place
    check_rollout_place(config, backend, spec, device=device)  # what auto takes is never refused


def test_auto_reads_the_measured_route_of_a_device_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "MEASURED_ROLLOUT", {"NVIDIA H200": "host-envs", "TPU v5 lite": "device"})
    config = PPOConfig().validate()
    assert rollout_place(config, ENVPOOL, ATARI, device=GPU) == "host-envs"
    # A measurement never makes a route the device cannot compile: EnvPool on the TPU stays on the host, on the
    # host route measured for the kind.
    assert rollout_place(config, ENVPOOL, ATARI, device=TPU) == "host"
    monkeypatch.setattr(placement, "MEASURED_HOST_ROUTE", {"TPU v5 lite": "host-envs"})
    assert rollout_place(config, ENVPOOL, ATARI, device=TPU) == "host-envs"


@pytest.mark.parametrize(("backend", "works"), [(ENVPOOL, "'auto', 'host-envs', 'host'"), (ALE, "'auto', 'host'")])
def test_the_device_route_on_a_tpu_is_refused_naming_the_routes_that_work(backend, works) -> None:
    config = PPOConfig(rollout_on="device").validate()
    check_rollout_place(config, backend, ATARI)  # the plan's check: no device known yet
    with pytest.raises(ConfigError) as refused:
        check_rollout_place(config, backend, ATARI, device=TPU)
    line = str(refused.value)
    assert "\n" not in line and f"{backend.name}'s env step into a TPU program" in line, line
    assert line.endswith(f"allowed: rollout_on={works}"), line
    check_rollout_place(config, backend, ATARI, device=GPU)


@pytest.mark.parametrize(
    ("extra", "device", "cores", "threads"),
    [
        ({}, CPU, 2, 1),  # on a CPU the policy acts on the cores that step the envs
        ({}, TPU, 13, 1),  # 8 envs: one actor
        ({"num_envs": 64}, TPU, 13, 4),  # one actor per 8 envs, at most a third of the cores
        ({"num_envs": 64}, TPU, 48, 8),
        ({"num_envs": 64, "actor_threads": 3}, TPU, 13, 3),  # the setting wins
        ({"num_envs": 64, "normalize_obs": True}, TPU, 13, 1),  # the statistics are one pool's
    ],
)
def test_the_actor_threads_are_chosen_for_the_device(monkeypatch, extra, device, cores, threads) -> None:
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert default_actor_threads(PPOConfig(**extra).validate(), device) == threads


@pytest.mark.parametrize(
    ("envs", "actors", "halves", "sizes"),
    [
        (8, 1, True, [[4, 4]]),  # one actor: today's two halves
        (3, 1, True, [[1, 2]]),
        (8, 4, True, [[1, 1], [1, 1], [1, 1], [1, 1]]),
        (10, 3, True, [[1, 2], [1, 2], [2, 2]]),
        (64, 4, False, [[16], [16], [16], [16]]),
        (2, 4, True, [[1], [1]]),  # never more actors than envs
        (1, 1, True, [[1]]),
    ],
)
def test_the_actors_split_the_envs_in_row_order(envs, actors, halves, sizes) -> None:
    seeds = list(range(100, 100 + envs))
    parts = actor_parts(seeds, actors, halves=halves)
    assert [[len(pool) for pool in actor] for actor in parts] == sizes
    assert [seed for actor in parts for pool in actor for seed in pool] == seeds


def test_autos_help_is_its_rules_and_each_rule_is_what_auto_takes() -> None:
    from ppo_eqx.config import PPOConfig as Config
    from ppo_eqx.presets import AUTO_ROLLOUT, auto_rollout_help

    assert auto_rollout_help() in " ".join(Config.__dataclass_fields__["rollout_on"].metadata["help"].split())
    cases = [  # one case of each rule, in AUTO_ROLLOUT's order
        (PPOConfig(network="lstm").validate(), ENVPOOL, MUJOCO, CPU),
        (PPOConfig().validate(), ENVPOOL, MUJOCO, CPU),
        (PPOConfig().validate(), ENVPOOL, ATARI, TPU),
        (PPOConfig().validate(), ENVPOOL, ATARI, CPU),
    ]
    taken = [rollout_place(config, backend, spec, device=device) for config, backend, spec, device in cases]
    assert taken == [route for route, _ in AUTO_ROLLOUT]


@pytest.mark.parametrize(
    ("extra", "envs", "sharing", "cores", "threads"),
    [
        ({}, 8, 1, 13, 8),  # a thread per env, at most the cores
        ({}, 64, 1, 13, 13),
        ({}, 8, 4, 13, 3),  # 64 envs of 4 actors: 8 pools, one of each actor's two stepping at a time
        ({}, 4, 8, 13, 1),  # never fewer than one
        ({}, 2, 1, 13, 2),
        ({"num_threads": 8}, 8, 4, 13, 8),  # the setting wins
        ({"num_threads": 8}, 4, 4, 13, 4),  # never more than the pool's envs
    ],
)
def test_pools_that_step_at_once_share_the_cores(monkeypatch, extra, envs, sharing, cores, threads) -> None:
    from ppo_eqx.host import fresh

    monkeypatch.setattr(fresh.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert fresh.env_threads(PPOConfig(**extra).validate(), envs, sharing=sharing).count == threads
