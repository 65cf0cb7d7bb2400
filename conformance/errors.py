"""Errors every command raises for bad input: one line, exit 2."""
class UsageError(Exception):
    """Bad input or options: printed as `error: ...`, exit status 2."""
