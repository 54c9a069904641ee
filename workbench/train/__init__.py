"""The training engine (torch): model, optimizers, LoRA, the loop, checkpoints, evaluation, sampling.

Run as ``python -m workbench.train RUN_DIR`` by the launcher. Reads its data through
:mod:`workbench.data` and its resolved settings from :mod:`workbench.plan`. Never imports textual.
"""
