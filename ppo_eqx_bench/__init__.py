"""ppo_eqx_bench: the Atari benchmark's game list and report, for ``bench/atari57.py`` and ``bench/report.py``.

Kept in the checkout beside ``bench/`` (not in the wheel; ``ppo_eqx`` never imports it); the plots need the
``[bench]`` extra (matplotlib).

    atari_games  the 57 games (ATARI_57)
    anchors      the reference tables shipped in data/ (CleanRL's 10M-step results; random and human scores)
    runs         reading run directories; a run's setting (what a sweep varies)
    stats        the numbers: HNS, IQM, bootstrap intervals, final returns, projected minutes
    tables       per-game rows, aggregates and a sweep's per-setting rows (build_report)
    render       report.md and report.json
    plots        the figures (matplotlib)
    report       write_report: all of the above, into one directory
    arguments    the scripts' command lines: one-line errors, checked before anything is read or written

Nothing is imported here, so that ``bench/atari57.py`` reads the game list without the report's imports.
"""
