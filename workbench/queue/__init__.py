"""The run queue and sweeps: many runs, one machine or several, nobody watching. Torch-free.

- ``store``   the queue's state: a SQLite database in the runs directory (``queue.db``: WAL, every change one
  transaction), its items (runs to start, in order, with their state and outcome), the pause flag, sweeps and
  their trials. Run names are reserved here, against the queue and the run directories alike.
- ``sweep_store`` a sweep's records in that database: its spec and its trials (a mixin of the store, whose
  transactions queue a trial's item with its record)
- ``runner``  ``workbench queue run``: one runner a machine (a lock), which starts the queued runs one after
  the other, each its own trainer through the CLI (``workbench train --detach``, as the TUI starts runs),
  watches it through its run directory, records how it ended, and on a restart adopts a trainer still alive or
  resumes one that died (``workbench resume``) from its last checkpoint.
- ``devices`` where a run trains: one a GPU (``CUDA_VISIBLE_DEVICES``; an nproc-N run on N free GPUs, by the
  estimate's memory against each GPU's free memory), or ``--slots N`` on a CPU machine, the cores divided
- ``placing`` the runner's placement of its runs by those rules (a mixin of the runner): the GPUs now, the slot
  or GPUs a queued run takes beside the runs it holds (or why it never can), a run's estimated need
- ``distributed``, ``dburl``  sweeps over several machines: one Optuna study in a shared database (``--storage
  postgresql://...``), a worker on each machine (``queue run --storage``), heartbeats, a dead worker's trial
  retried once elsewhere; the URL made SQLAlchemy's, masked wherever shown, SQLite on NFS refused
- ``shared_study`` a shared study read: its sweeps and trials as ``sweep ls/show --storage`` and the Queue tab
  show them; the spec and trial count kept as study attributes
- ``admit``   a run checked and estimated as ``workbench train`` would check it, before it is queued; a
  sweep's trial that does not fit auto-fitted to a smaller micro-batch with the same tokens per step
- ``launch``  starting, stopping and resuming runs through the CLI (the queue never imports torch)
- ``view``    the queue as ``queue ls`` and the TUI's Queue tab show it
- ``doctor``  the queue as ``workbench doctor`` and the TUI's health box see it: a run's place in the queue (or
  how it ended there: pruned by which rule, failed with its note), the queue's line (what runs, what waits, the
  runner), and the finding of runs waiting with no runner
- ``outcome`` what a run reached (the metric a sweep ranks by), and the one line a failed run is listed with
  (the run doctor's top finding).
- ``sweep``, ``sweep_spec``  sweeps: a spec (TOML, or ``--set-grid``), trials made and estimated before anything is
  queued, the search and the pruners (median, successive halving) from Optuna (its own SQLite storage beside
  the queue's); ``sweep_results``: the results table, the compute pruning saved and the ranking's caveats.
- ``best``    a sweep's best trial kept as a user preset (``sweep save-best``), through config's one writer.
- ``rounds``  iterated on-policy tuning (``workbench rounds``): a chain's spec, pairs and records in
  ``runs/CHAIN.rounds/``; the runner writes a round's pairs (``workbench pairs``) before its trainer starts and
  queues the next round when it finishes.

What lives where (see README, "Queues and sweeps"): the queue and the sweeps survive the TUI quitting, the
runner's kill -9 and a reboot, because nothing is held in a process that matters: the database, the run
directories and Optuna's storage are the state.
"""
