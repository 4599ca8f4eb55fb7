"""Errors the command line turns into one line and exit code 2."""


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2, no traceback."""
