"""Analysis: torch-free reading of past runs.

- ``summary``   one run's summary for ``workbench runs`` and the Runs pane
- ``history``   what earlier runs of a preset measured (tokens/s, memory), for the estimate
- ``lineage``   which run a run branched or was fine-tuned from, and branching a run at a checkpoint
- ``doctor``    findings on a run (speed, memory, stability, generalization, corpus), each with its fix

May import: plan, machine, rundir, config, fs, fmt, errors. Never torch or textual.
"""
