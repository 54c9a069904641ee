"""The panes of the workbench TUI, one module each."""
