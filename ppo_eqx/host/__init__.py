"""The host side of training, around the pure core (``ppo_eqx.core``): the ``Trainer`` that owns the envs and
the compiled iteration, the loop that dispatches iterations and reads their metrics, checkpoint files and the
run directory's layout, and evaluation. What a library user composes; the command line (``ppo_eqx.cli``) is
built on it."""
