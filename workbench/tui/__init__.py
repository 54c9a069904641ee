"""The workbench terminal UI (Textual). Never imports torch.

Where things live:

- ``app.py``        WorkbenchApp: layout, the run list and tailer, routing of the panes' requests,
                    start / resume / stop / delete workers; ``run_tui`` entry
- ``operations.py`` what the app does on a request: start, resume, stop, delete a run, change the queue (the
                    CLI in a thread worker), and what follows when a run has started
- ``messages.py``   app-wide messages: workers' reports, and the StartRun / ResumeRun / StopRun requests
- ``watcher.py``    the tailer thread: new bytes of metrics.jsonl / train.log, status.json, tasks.jsonl
- ``rundata.py``    what is known about one run (series, task scores, latest numbers, rate and ETA)
- ``launcher.py``   the CLI subprocesses: train / resume / stop --detach, streaming sample
- ``chat_server.py`` the Sample pane's chat models kept loaded between turns (``workbench chat --serve``)
- ``hwinfo.py``     hardware facts and capabilities without torch
- ``display.py``    how numbers and run states read on screen
- ``plot.py``       plotext loss curves and task scores as ANSI text
- ``palette.py``    command-palette provider (every action)
- ``widgets/``      one module per pane (each acts on its own keys and posts its requests, nested in its
                    class), ``pane.py`` what every pane offers, ``tabs.py`` the tabs; ``screens/`` dialogs
- ``workbench.tcss`` the one stylesheet
"""
