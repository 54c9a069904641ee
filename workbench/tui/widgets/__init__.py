"""The panes of the workbench TUI, one module each (each acts on its own keys and posts its requests):

- ``monitor``   Train: progress with ETA, live numbers, events, the train.log tail
- ``health``    the Train pane's Health box: the run doctor's findings for the run shown
- ``curves``    loss curves of one or several runs (step or tokens, log axis, smoothing), or task scores
- ``runs``      every run with its state and checkpoints, the report card; resume, branch, delete
- ``sample``    two checkpoints side by side, streamed (or a chat with a chat-tuned run): the run, its checkpoints,
  the mode and the one worker loop; its halves ``sample_text`` and ``sample_chat``, ``sample_output``, the
  columns they share, and ``sample_sources``, what it reads from a run directory (checkpoints, picks, samples)
- ``queue``     the Queue tab: the run queue and sweeps, read from ``queue.db``; ``queue_shared``, the sweeps of a
  shared study database (``--storage``), read through a read-only connection
- ``presets``   shipped and user presets, the TOML editor validated as you type, the estimate
- ``hardware``  CPU, RAM, GPUs (live), capabilities, the recommended preset
- ``pane``      what every pane offers the app
- ``tabs``      the tabs, one pane each
"""
