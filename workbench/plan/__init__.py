"""Planning: torch-free policy and arithmetic on a preset (past runs are read in :mod:`workbench.analysis`).

What will run and the estimate at the top, the parts they are made of in three folders, each a map of its own:

- ``run_plan``   what will run: a new run's request and preset, and a resume's, with every refusal
- ``settings``   every ``auto`` of a preset resolved once, on a given machine, into frozen RunSettings
- ``sampling``   the sampling defaults (text and chat) every sampler reads: the CLI, the TUI, the trainer
- ``report``     the ``workbench estimate`` report (CLI and TUI) and the fit check
- ``preflight``  what every way of starting a run checks first: the plan, the estimate, the corpus
- ``compare``    a preset as if on a GPU of the table (``estimate --gpu``), and on every common GPU (``--compare``)
- ``throughput`` tokens/s on a GPU of the table: its peak x an MFU, measured or scaled from a measurement
- ``cost``       run time, energy and cost
- ``fit/``       will it fit: parameters and FLOPs (``flops``), what a block saves for backward (``activations``),
  memory by component (``memory``), the savers auto decides (``savers``), the micro-batch search (``batch``), the
  preset that suits a machine (``recommend``)
- ``schedule/``  where a run ends and its learning rate at each step (``horizon``), what a time budget buys
  (``budget_plan``), how many eval batches auto takes (``evals``)
- ``recipe/``    what a run starts from and optimises: ``--init-from`` (``finetune``), a preference run's objective
  (``objective_plan``)
"""
