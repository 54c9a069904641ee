"""Analysis: torch-free reading of past runs.

- ``summary``   one run's summary for ``workbench runs`` and the Runs pane
- ``history``   what earlier runs of a preset measured (tokens/s, memory), for the estimate
- ``lineage``   which runs a run branched from, back to the first (branches are made in rundir)
- ``report_card`` task scores by step (metrics.jsonl and tasks.jsonl), and one checkpoint's report card
- ``time_spent``  where a run's wall-clock went: evals and checkpoint saves against the whole
- ``doctor``    findings on a run (speed, memory, stability, generalization, corpus, chat), each with its fix

May import: plan, machine, rundir, config, fs, fmt, errors. Never torch or textual.
"""
