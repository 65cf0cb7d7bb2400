"""Reading the program files the commands take: corpus entries or bare programs, validated,
every problem a UsageError naming the file and the field."""
from __future__ import annotations

import json
from pathlib import Path

from conformance.errors import UsageError


def load_program_file(path: str, limits=None):
    """(program, inputs or None, finding or None) from a corpus entry or a bare program file."""
    from conformance.findings import CorpusEntry, decode_inputs
    from conformance.ir import ProgramError, load_program
    from pydantic import ValidationError
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    if size > 16 * 1024 * 1024:
        raise UsageError(f"{path}: file too large ({size} bytes; limit 16 MiB)")
    try:
        obj = json.loads(p.read_text())
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise UsageError(f"{path}: nesting too deep") from None
    if isinstance(obj, dict) and "program" in obj:
        try:
            prog = load_program(obj["program"], limits)
        except ProgramError as e:
            raise UsageError(f"{path}: program.{e.field}: {e.reason}") from None
        try:
            entry = CorpusEntry.model_validate(obj)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise UsageError(f"{path}: {loc}: {err['msg']}") from None
        inputs = decode_inputs(entry.inputs)
        types = {i.id: i for i in prog.inputs}
        if set(inputs) != set(types):
            raise UsageError(f"{path}: inputs: ids {sorted(inputs)} do not match the program's {sorted(types)}")
        for k, v in inputs.items():
            if list(v.shape) != types[k].shape or str(v.dtype) != types[k].dtype:
                raise UsageError(f"{path}: inputs.{k}: shape/dtype {list(v.shape)}/{v.dtype} do not match the "
                                 f"program's {types[k].shape}/{types[k].dtype}")
        return prog, inputs, entry.finding
    try:
        return load_program(obj, limits), None, None
    except ProgramError as e:
        raise UsageError(f"{path}: {e.field}: {e.reason}") from None
