"""The TUI process must never import torch (not even through workbench.train)."""

import subprocess
import sys


def test_tui_does_not_import_torch():
    # the app, and every module it loads after its first frame (the panes, the palette, the forms)
    code = ("import sys, workbench.tui.app, workbench.tui.palette, workbench.tui.widgets.hardware, "
            "workbench.tui.screens.new_run; "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'workbench.train'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the TUI imported: {r.stdout} {r.stderr}"


def test_every_message_handler_of_the_app_names_a_message():
    """The app routes the panes' messages by handler name (on_runs_pane_sample_requested: the panes' modules
    load after the first frame, so their classes are not at hand for @on): a name that no message has would
    never be called, silently."""
    from textual.message import Message

    from workbench.tui.app import WorkbenchApp
    from workbench.tui.palette import WorkbenchCommands  # noqa: F401 - imports every pane but one, so their messages
    from workbench.tui.widgets.hardware import HardwarePane  # noqa: F401 - and that one
    from workbench.tui.widgets.queue import QueuePane  # noqa: F401 - and the Queue tab's (the palette has no action
    # of its own there: alone, this test missed its messages; in a full run another module had imported it)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    names = {m.handler_name for m in subclasses(Message)}
    handlers = [n for n in dir(WorkbenchApp) if n.startswith("on_") and callable(getattr(WorkbenchApp, n))
                and n not in ("on_mount", "on_unmount", "on_event")]
    textual_own = {n for n in handlers if any(n in vars(c) for c in WorkbenchApp.__mro__[1:])}
    unknown = [n for n in handlers if n not in names and n not in textual_own]
    assert not unknown, unknown
    assert "on_runs_pane_sample_requested" in handlers and "on_health_box_checked" in handlers


def test_the_first_frame_loads_only_what_it_shows():
    """What bare `workbench` loads before the Hardware pane's first reading is drawn: the app, the Hardware
    pane and the recommendation, not every command's module (the full parser), the other panes, the palette,
    the corpus readers or numpy. Those were 0.5 s of a new user's first second (bench/tui_first_paint.py:
    Hardware pane 0.949 -> 0.468 s at a load of 4 on 2 cores)."""
    code = ("import sys; from workbench.cli import bare_tui_args; assert bare_tui_args([]) is not None; "
            "import workbench.tui.app; from workbench.tui import hwinfo; "
            "from workbench.tui.widgets.hardware import HardwarePane; hwinfo.recommend(hwinfo.detect()); "
            "print(' '.join(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split())
    later = {"numpy", "workbench.data.chat.chat_data", "workbench.data.text.tokenizer", "workbench.plan.run_plan",
             "workbench.commands.train", "workbench.tui.palette", "workbench.tui.screens.new_run",
             *(f"workbench.tui.widgets.{p}" for p in ("presets", "monitor", "curves", "sample", "runs"))}
    assert not later & loaded, sorted(later & loaded)
