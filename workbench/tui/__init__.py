"""The workbench terminal UI (Textual). Never imports torch.

Where things live:

- ``app.py``        WorkbenchApp: tabs, key bindings, workers, actions; ``run_tui`` entry
- ``watcher.py``    the tailer thread: new bytes of metrics.jsonl / train.log, status.json
- ``rundata.py``    what is known about one run (series, latest numbers, rate and ETA)
- ``launcher.py``   the CLI subprocesses: train / resume / stop --detach, streaming sample
- ``hwinfo.py``     hardware facts and capabilities without torch
- ``plot.py``       plotext loss curves as ANSI text
- ``palette.py``    command-palette provider (every action)
- ``widgets/``      one module per pane; ``screens/`` the modal dialogs
- ``workbench.tcss`` the one stylesheet
"""
