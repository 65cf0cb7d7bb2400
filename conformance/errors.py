"""Errors every command raises for bad input: one line, exit 2."""
class UsageError(Exception):
    """Bad input or options: printed as `error: ...`, exit status 2."""


def field_path(err: dict) -> str:
    """The field a pydantic validation error names, as the messages spell fields: a.b[0].c."""
    return "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"]).lstrip(".") or "<root>"
