"""The pure core: typed functions on arrays, jittable, that know nothing of files, clocks, threads, printing or
the command line. Data flows one way, ``envs -> rollout -> gae -> collect``, ``networks -> loss -> update``,
and ``iteration`` composes them; a module imports only what stands before it. The host side that runs them
(pools' lifetimes, the loop, checkpoint files) is ``ppo_eqx.host``; the command line is ``ppo_eqx.cli``."""
