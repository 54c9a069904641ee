"""Planning: torch-free policy and arithmetic on a preset (past runs are read in :mod:`workbench.analysis`).

- ``settings``   every ``auto`` of a preset resolved once, on a given machine, into frozen RunSettings
- ``savers``     the memory savers auto decides (the fused loss, activation checkpointing) from the estimate
- ``flops``      parameter counts and FLOPs per token
- ``activations`` what one block saves for backward (QK-norm, LoRA, packed rows)
- ``memory``     training memory by component (a frozen MemoryEstimate)
- ``horizon``    where a run ends, a wsd decay's start and the learning rate at each step; ``resume --more``'s note
- ``evals``      how many eval batches auto takes
- ``sampling``   the sampling defaults (text and chat) every sampler reads: the CLI, the TUI, the trainer
- ``finetune``   ``--init-from``: the fine-tune's preset, its link to the source weights, which method fits
- ``objective_plan`` a preference run's objective decided once from its row of the table (config.objectives): its beta,
  summed or averaged log-probs, its reference
- ``cost``       run time, energy and cost
- ``run_plan``   what will run: a new run's preset and a resume's, with every refusal
- ``batch``      the micro-batch search and gradient-accumulation plan ``fit`` uses
- ``recommend``  the preset that suits a machine, and what to change when one does not fit
- ``report``     the ``workbench estimate`` report (CLI and TUI)
- ``throughput`` tokens/s on a GPU of the table: its peak x an MFU, measured or scaled from a measurement
- ``compare``    a preset as if on a GPU of the table (``estimate --gpu``), and on every common GPU (``--compare``)
"""
