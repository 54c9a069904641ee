"""Driving the Textual app in tests: an app on canned runs and injected hardware, waiting for what it shows,
and reading it back."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from textual.css.query import NoMatches

from tests.support.canned_runs import HARDWARE


def make_app(runs_dir, **kw):
    """The app, whose ``run_test`` hands the pilot over once every pane is there: the app makes the first
    screen's pane before its first frame and the others right after it (a user's first tenth of a second)."""
    from workbench.tui.app import WorkbenchApp
    kw.setdefault("hardware_info", HARDWARE)
    kw.setdefault("watch_interval", 0.1)
    kw.setdefault("list_interval", 60.0)
    app = WorkbenchApp(runs_dir, **kw)
    # Tests read what the app said from its notifications; a toast's 5 s would drop one before it is read on a
    # loaded machine (the CI's 2 cores at a load of 10: test_requests' "Resuming ..." was gone when asked for).
    app.NOTIFICATION_TIMEOUT = 600
    run_test = app.run_test

    @asynccontextmanager
    async def run_test_with_panes(*args, **kwargs):
        async with run_test(*args, **kwargs) as pilot:
            await wait_for(pilot, lambda: app.panes_ready, what="every pane mounted")
            yield pilot

    app.run_test = run_test_with_panes
    return app


# What a condition may raise while the thing it looks at is not there yet: a widget not mounted
# (NoMatches), a run not read yet (KeyError), a list still empty (IndexError). Anything else is a
# real error and fails the test at once, instead of showing up as a timeout.
NOT_YET = (NoMatches, KeyError, IndexError)


async def wait_for(pilot, cond, timeout: float = 20.0, what: str | Callable[[], str] = "condition"):
    """Let the app run until ``cond()`` is true (thread workers deliver asynchronously). ``what`` may be
    a function, called at the timeout, so the message shows the state then, not at the start."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            if cond():
                return
        except NOT_YET as e:
            last = e
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            raise AssertionError(f"timed out waiting for {what}" + (f" (last: {last!r})" if last else ""))
        await pilot.pause(0.05)


async def open_sample_on(pilot, app, run_id: str):
    """The Sample pane (key 5) once the runs are listed and ``run_id`` is its run; the pane."""
    from textual.widgets import Select
    await wait_for(pilot, lambda: app.summaries, what="the run list")
    await pilot.press("5")
    await wait_for(pilot, lambda: app.query_one("#smp-run", Select).value == run_id, what=f"run {run_id} chosen")
    return app.query_one("#sample-pane")


async def open_preset(pilot, app, name: str):
    """The Presets pane (the app opened on it) once it shows a preset, then ``name`` loaded; the pane."""
    pane = app.query_one("#presets-pane")
    await wait_for(pilot, lambda: pane.current is not None, what="a preset shown")
    pane.load(name)
    return pane


async def paste(pilot, text: str) -> None:
    """Paste ``text`` into the focused widget as a terminal's bracketed paste delivers it: one Paste event through
    the driver, as the key presses come. (A long line pressed a key at a time costs ~80 ms a key under the pilot:
    the sweep form's 315-character ``--set`` line took 25 s of a test.)"""
    from textual import events
    event = events.Paste(text)
    event.set_sender(pilot.app)
    pilot.app._driver.send_message(event)
    await pilot.pause()


def notified(app, message: str) -> bool:
    """Whether the app has shown the user exactly ``message`` (a toast)."""
    return any(str(n.message) == message for n in app._notifications)


def run(coro):
    return asyncio.run(coro)


def text_of(widget) -> str:
    """The plain text a Static/Label shows (its content, rendered wide without colour)."""
    from rich.console import Console
    from rich.text import Text
    from textual.content import Content
    content = widget.content
    if isinstance(content, str):
        content = Content.from_markup(content)
    if isinstance(content, (Text, Content)):
        return content.plain
    console = Console(width=400, record=True, color_system=None, file=open(os.devnull, "w"))
    console.print(content)
    return console.export_text()


def palette_top(app) -> str | None:
    """The command the command palette has highlighted (what enter runs), once its search has answered."""
    from textual.command import CommandList
    cl = app.screen.query_one(CommandList)
    if not cl.option_count:
        return None
    prompt = cl.get_option_at_index(cl.highlighted or 0).prompt
    return (prompt.plain if hasattr(prompt, "plain") else str(prompt)).split("\n")[0]  # the help is below


async def run_palette_command(pilot, app, typed: str, command: str) -> None:
    """Open the command palette, type ``typed``, wait until ``command`` is the one highlighted, run it."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*typed)
    await wait_for(pilot, lambda: palette_top(app) == command, what=f"the command {command!r}")
    await pilot.press("enter")
