"""The tabs, one pane each: showing a tab focuses its pane at once and tells the pane it is shown."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.css.query import NoMatches
from textual.widgets import TabbedContent

from workbench.tui.widgets.pane import Pane


class PaneTabs(TabbedContent):
    """TabbedContent whose every TabPane holds one Pane."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._labels: dict[str, str] = {}  # tab -> its label without a marker

    WORDS_FROM = 100  # columns from which a marker keeps its words ("●2 findings"); below, its first word ("●2")

    def mark(self, tab: str, marker: str = "", style: str = "") -> None:
        """Show ``marker`` after the tab's label (e.g. "●2 findings" in red: the run shown has findings; under
        :attr:`WORDS_FROM` columns its first word, so that seven tabs still fit 80); "" clears it."""
        try:
            t = self.get_tab(tab)
        except (NoMatches, ValueError):
            return
        if marker and self.app.size.width < self.WORDS_FROM:
            marker = marker.split(" ", 1)[0]
        base = self._labels.setdefault(tab, t.label.plain)
        label = Text.assemble(base, (f" {marker}", style)) if marker else Text(base)
        if t.label.plain != label.plain or marker:
            t.label = label

    def pane(self, tab: str) -> Pane | None:
        """The pane in ``tab``; None for no such tab."""
        try:
            return next((w for w in self.get_pane(tab).children if isinstance(w, Pane)), None)
        except NoMatches:
            return None

    def show(self, tab: str) -> None:
        """Show ``tab`` and focus its pane's main widget now, in the same step: keys typed right
        after the tab key (a quick "3 x y", or keys buffered while the app was busy) must reach the
        new pane, not the old one or nothing."""
        if self.active != tab:
            self.active = tab  # the switcher shows the new pane at once
        self.focus_pane(tab)

    def focus_pane(self, tab: str) -> None:
        """Focus the pane's main widget so its key bindings are live and shown in the footer."""
        if (pane := self.pane(tab)) is not None:
            pane.focus_main()

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or ""
        focused = self.screen.focused
        if focused is None or event.pane not in focused.ancestors:  # e.g. a click on the tab
            self.focus_pane(tab)
        if (pane := self.pane(tab)) is not None:
            pane.tab_shown()
