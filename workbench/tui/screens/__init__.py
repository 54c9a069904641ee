"""Modal screens, one module each:

- ``dialogs``       yes/no confirmation and asking for a name (save-as)
- ``new_run``       the new-run form: preset, corpus, name, overrides, validated before launching
- ``import_model``  the "Import model" dialog: a local Hugging Face model directory as a run to fine-tune from
- ``more_steps``    continue a finished run for N more steps, and what that does to the learning rate
- ``run_jobs``      the "Evaluate" and "Export" dialogs of a run's checkpoint (``workbench eval`` / ``export``)
- ``sweep_form``    the sweep form: searched keys, method, budget per trial, pruner; each trial's estimate and
                    warnings as ``workbench sweep`` admits it, queued by ``workbench sweep``
"""
