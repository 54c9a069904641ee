"""workbench: train small GPT-style language models on your own machine.

The layers, lowest first (each imports only those below it; README's Architecture table says more):

- ``errors``, ``fs``, ``fmt``, ``faults``   the one exception, atomic files, formats, test fault injection
- ``cli_client``  the CLI run as a child process: the one client of the queue's runner and the TUI
- ``config``     presets: the sections as documented dataclasses, TOML and ``--set``
- ``rundir``     the run-directory contract: file names, the one writer, status, records, checkpoint listing
- ``machine``    what this machine has; the GPU table
- ``data``       corpora, conversations and eval tasks, read, tokenized and prepared (no torch)
- ``reward``     rewards (built-in checks or the user's function), pairs from scored samples, pass@k (no torch)
- ``plan``       every ``auto`` resolved, what will run, estimates, a run's horizon (no torch)
- ``analysis``   past runs: summaries, lineage, report cards, the run doctor (no torch)
- ``queue``      the run queue and sweeps: many runs one after the other, Optuna's search (no torch)
- ``train``      the engine (torch)
- ``interop``    Hugging Face import and export, GGUF
- ``commands``, ``cli``, ``__main__``   the command line
- ``tui``        the terminal UI (Textual; never torch)
"""

__version__ = "0.1.0"
