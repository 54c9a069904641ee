"""The one exception type the CLI turns into a single clear line and a non-zero exit."""


class WorkbenchError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""

    exit_code = 2
