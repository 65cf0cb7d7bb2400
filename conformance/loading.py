"""Reading the program files the commands take: corpus entries or bare programs, validated,
every problem a UsageError naming the file and the field."""
from __future__ import annotations

import json
import math
import re

from conformance.errors import UsageError
from conformance.files import MiB, InputRefused, read_text
from conformance.findings import observations_problem

# What a corpus entry's finding may hold where its strings reach generated code and reports:
# a documented character set (anything else is refused, never pasted).
TOKEN = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")          # error types, version strings, flag names
HASH = re.compile(r"^[0-9a-f]{16}$")


def check_finding(f, where: str) -> None:
    """Refuse a finding whose names are unknown or whose strings leave their character set."""
    from conformance import pipelines as registry
    from conformance.features import known_features
    from conformance.verdict import CHECKS, NON_PIPELINE_REFERENCES as VERDICT_REFS
    known = registry.known_names()
    features = known_features()
    if f.check not in CHECKS:
        raise UsageError(f"{where}.check: unknown check {f.check!r}; known: {', '.join(CHECKS)}")
    if f.pipeline not in known:
        raise UsageError(f"{where}.pipeline: unknown pipeline {f.pipeline!r}; known: {', '.join(known)}")
    if f.reference not in known and f.reference not in VERDICT_REFS:
        raise UsageError(f"{where}.reference: unknown reference {f.reference!r}; known: pipelines, "
                         f"{', '.join(VERDICT_REFS)}")
    if not TOKEN.match(f.error_type):
        raise UsageError(f"{where}.error_type: must match {TOKEN.pattern}")
    if not HASH.match(f.program_hash):
        raise UsageError(f"{where}.program_hash: must be 16 hex digits")
    for k, x in enumerate(f.features):
        if x not in features:
            raise UsageError(f"{where}.features[{k}]: unknown feature {x!r} (see the README's feature vocabulary)")
    for k, v in f.versions.items():
        if not (TOKEN.match(k) and isinstance(v, str) and TOKEN.match(v)):
            raise UsageError(f"{where}.versions.{k}: names and versions must match {TOKEN.pattern}")
    for k, v in f.flags.items():   # the JAX flags reach repro scripts: booleans only; the rest is data
        if k.startswith("jax_") and not (TOKEN.match(k) and isinstance(v, bool)):
            raise UsageError(f"{where}.flags.{k}: a JAX flag must be named by {TOKEN.pattern} and be a boolean")
    if f.device not in ("cpu", "cuda"):
        raise UsageError(f"{where}.device: must be cpu or cuda, got {f.device!r}")
    if f.expectation is not None and not TOKEN.match(f.expectation):
        raise UsageError(f"{where}.expectation: must match {TOKEN.pattern}")
    if f.tracked is not None and not TOKEN.match(f.tracked):
        raise UsageError(f"{where}.tracked: must match {TOKEN.pattern}")
    bad = observations_problem(f.detail)   # what reports show of each pipeline, in the report's own shape
    if bad is not None:
        raise UsageError(f"{where}.detail.observations{bad[0]}: {bad[1]}")
    for k, key in enumerate(f.reproduces):   # sibling keys: (check, pipeline, reference, error type)
        w = f"{where}.reproduces[{k}]"
        if len(key) != 4:
            raise UsageError(f"{w}: must be [check, pipeline, reference, error type]")
        if key[0] not in CHECKS or key[1] not in known or (key[2] not in known and key[2] not in VERDICT_REFS) \
                or not TOKEN.match(key[3]):
            raise UsageError(f"{w}: unknown check, pipeline or reference, or an error type outside {TOKEN.pattern}")


def load_program_file(path: str, limits=None):
    """(program, inputs or None, finding or None) from a corpus entry or a bare program file."""
    from conformance.findings import SCHEMA_VERSION, CorpusEntry, decode_inputs
    from conformance.batching import value_shape
    from conformance.ir import ProgramError, load_program
    from pydantic import ValidationError
    try:
        text = read_text(path, 16 * MiB)
    except InputRefused as e:
        raise UsageError(str(e)) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    except (RecursionError, ValueError) as e:   # nesting, or an integer of thousands of digits
        raise UsageError(f"{path}: {'nesting too deep' if isinstance(e, RecursionError) else e}") from None
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
        for where, sv in (("schema_version", entry.schema_version),
                          ("finding.schema_version", entry.finding.schema_version if entry.finding else SCHEMA_VERSION)):
            if sv != SCHEMA_VERSION:
                raise UsageError(f"{path}: {where}: {sv!r} is not readable (this harness reads {SCHEMA_VERSION})")
        if entry.finding is not None:
            check_finding(entry.finding, f"{path}: finding")
        types = {i.id: i for i in prog.inputs}
        if set(entry.inputs) != set(types):
            raise UsageError(f"{path}: inputs: ids {sorted(entry.inputs)} do not match the program's {sorted(types)}")
        for k, v in entry.inputs.items():
            shape = list(value_shape(prog, types[k]))
            if v.dtype != types[k].dtype or v.shape != shape:
                raise UsageError(f"{path}: inputs.{k}: shape/dtype {v.shape}/{v.dtype} do not match the "
                                 f"program's {shape}/{types[k].dtype}")
            flat = _flatten(v.data)
            if flat is None or len(flat) != math.prod(v.shape) or not all(math.isfinite(x) for x in flat):
                raise UsageError(f"{path}: inputs.{k}.data: must hold {math.prod(v.shape)} finite numbers "
                                 f"in the shape {v.shape}")
        try:
            inputs = decode_inputs(entry.inputs)
        except ValueError as e:   # ragged nesting
            raise UsageError(f"{path}: inputs: data not nested as the declared shape ({e})") from None
        return prog, inputs, entry.finding
    try:
        return load_program(obj, limits), None, None
    except ProgramError as e:
        raise UsageError(f"{path}: {e.field}: {e.reason}") from None


def _flatten(data) -> list[float] | None:
    """The numbers of nested lists (None if anything else is in there)."""
    out: list[float] = []
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append(float(x) if abs(x) < 1e308 else math.inf)
        else:
            return None
    return out


def corpus_fixed_keys(directory) -> set[str]:
    """The finding keys ("check|pipeline|reference|error_type") a corpus directory's status.json
    lists under "fixed" (none without the file)."""
    from pathlib import Path
    st = Path(directory) / "status.json"
    if not st.exists():
        return set()
    try:
        obj = json.loads(read_text(str(st), MiB))
    except (InputRefused, ValueError) as e:
        raise UsageError(f"{st}: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("fixed", {}), dict):
        raise UsageError(f"{st}: fixed: must be an object of finding keys")
    return set(obj.get("fixed", {}))


def corpus_entry_stem(check: str, pipeline: str, program_hash: str) -> str:
    """The name a regression-corpus entry of a finding has (without .json), its test id too."""
    return f"{check}-{pipeline.replace(':', '_')}-{program_hash[:8]}"


def load_known(paths: list[str], limits=None):
    """The findings of regression-corpus entries (`run --known`): each path a corpus entry or a
    directory of them. A directory's status.json lists fixed keys under "fixed": those entries
    are not known behaviours (a recurrence is a regression) and are left out. Each finding is
    returned with `tracked` set to its file's name."""
    from pathlib import Path
    out, names = [], set()
    for path in paths:
        p = Path(path)
        if p.is_dir():
            fixed = corpus_fixed_keys(p)
            files = [f for f in sorted(p.glob("*.json")) if f.name != "status.json"]
            if not files:
                raise UsageError(f"--known: {p}: no corpus entries (*.json) in this directory")
        elif p.is_file():
            fixed, files = set(), [p]
        else:
            raise UsageError(f"--known: {p}: no such file or directory")
        for f in files:
            _, _, finding = load_program_file(str(f), limits)
            if finding is None:
                raise UsageError(f"{f}: finding: a known behaviour needs a corpus entry with a finding")
            if "|".join(finding.key()) in fixed or f.name in names:
                continue
            names.add(f.name)
            out.append(finding.model_copy(update={"tracked": f.name}))
    return out
