"""Reading the program files the commands take: corpus entries or bare programs, validated,
every problem a UsageError naming the file and the field."""
from __future__ import annotations

import json
import math
import re

from conformance.engine.findings import (
    ROOT_SCHEMA_VERSION,
    SCHEMA_VERSION,
    CorpusEntry,
    CorpusRoot,
    decode_inputs,
    observations_problem,
)
from conformance.errors import UsageError
from conformance.files import InputRefused, MiB, read_text
from conformance.ir import releases
from conformance.ir.batching import value_shape
from conformance.ir.features import known_features
from conformance.ir.nodes import ProgramError
from conformance.ir.program import load_program
from conformance.ir.verdict import CHECKS
from conformance.ir.verdict import NON_PIPELINE_REFERENCES as VERDICT_REFS
from conformance.pipelines import registry

# What a corpus entry's finding may hold where its strings reach generated code and reports:
# a documented character set (anything else is refused, never pasted).
TOKEN = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")          # error types, version strings, flag names
HASH = re.compile(r"^[0-9a-f]{16}$")


def check_finding(f, where: str) -> None:
    """Refuse a finding whose names are unknown or whose strings leave their character set."""
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
            raise UsageError(f"{where}.features[{k}]: unknown feature {x!r} (see docs/reference/features.md)")
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


def _read_json(path: str):
    try:
        text = read_text(path, 16 * MiB)
    except InputRefused as e:
        raise UsageError(str(e)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    except (RecursionError, ValueError) as e:   # nesting, or an integer of thousands of digits
        raise UsageError(f"{path}: {'nesting too deep' if isinstance(e, RecursionError) else e}") from None


def _is_root(obj) -> bool:
    return isinstance(obj, dict) and "variants" in obj


def _validation_error(path: str, e, prefix: str = "") -> UsageError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return UsageError(f"{path}: {prefix}{loc}: {err['msg']}")


def _load_entry(path: str, obj: dict, limits, prefix: str = ""):
    """(program, inputs, finding or None) of one corpus entry's object (`prefix`: where it sits in
    the file, for a root's variants)."""
    from pydantic import ValidationError
    try:
        prog = load_program(obj["program"], limits)
    except ProgramError as e:
        raise UsageError(f"{path}: {prefix}program.{e.field}: {e.reason}") from None
    try:
        entry = CorpusEntry.model_validate({k: v for k, v in obj.items() if k != "name"} if prefix else obj)
    except ValidationError as e:
        raise _validation_error(path, e, prefix) from None
    for where, sv in (("schema_version", entry.schema_version),
                      ("finding.schema_version", entry.finding.schema_version if entry.finding else SCHEMA_VERSION)):
        if sv != SCHEMA_VERSION:
            raise UsageError(f"{path}: {prefix}{where}: {sv!r} is not readable (this harness reads {SCHEMA_VERSION})")
    if entry.finding is not None:
        check_finding(entry.finding, f"{path}: {prefix}finding")
    types = {i.id: i for i in prog.inputs}
    if set(entry.inputs) != set(types):
        raise UsageError(
            f"{path}: {prefix}inputs: ids {sorted(entry.inputs)} do not match the program's {sorted(types)}"
        )
    for k, v in entry.inputs.items():
        shape = list(value_shape(prog, types[k]))
        if v.dtype != types[k].dtype or v.shape != shape:
            raise UsageError(f"{path}: {prefix}inputs.{k}: shape/dtype {v.shape}/{v.dtype} do not match the "
                             f"program's {shape}/{types[k].dtype}")
        flat = _flatten(v.data)
        if flat is None or len(flat) != math.prod(v.shape) or not all(math.isfinite(x) for x in flat):
            raise UsageError(f"{path}: {prefix}inputs.{k}.data: must hold {math.prod(v.shape)} finite numbers "
                             f"in the shape {v.shape}")
    try:
        inputs = decode_inputs(entry.inputs)
    except ValueError as e:   # ragged nesting
        raise UsageError(f"{path}: {prefix}inputs: data not nested as the declared shape ({e})") from None
    return prog, inputs, entry.finding


def _load_root(path: str, obj: dict, limits):
    """A corpus root's variants: [(name, program, inputs, finding)], each finding carrying the
    root's title and class."""
    from pydantic import ValidationError
    variants = obj.get("variants")
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) for v in variants):
        raise UsageError(f"{path}: variants: must be a non-empty list of corpus entries")
    loaded = []
    for k, v in enumerate(variants):
        if "program" not in v or "finding" not in v:
            raise UsageError(f"{path}: variants[{k}]: a variant needs a program and a finding")
        loaded.append(_load_entry(path, v, limits, f"variants[{k}]."))
    try:
        root = CorpusRoot.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(path, e) from None
    if root.schema_version != ROOT_SCHEMA_VERSION:
        raise UsageError(f"{path}: schema_version: {root.schema_version!r} is not readable "
                         f"(a corpus root here is {ROOT_SCHEMA_VERSION})")
    for field, value in (("root", root.root), *((f"variants[{k}].name", v.name) for k, v in enumerate(root.variants))):
        if not TOKEN.match(value) or not value:
            raise UsageError(f"{path}: {field}: must match {TOKEN.pattern}")
    out = []
    for v, (prog, inputs, finding) in zip(root.variants, loaded):
        finding = finding.model_copy(update={"title": root.title, "triage": root.triage, "releases": root.releases})
        out.append((v.name, prog, inputs, finding))
    return root, out


def _load_file(path: str, limits=None):
    """(CorpusRoot or None, [(name, program, inputs or None, finding or None)]) from one read of a
    corpus root (its variants), a corpus entry or a bare program file (one, named by the file)."""
    from pathlib import Path
    obj = _read_json(path)
    if _is_root(obj):
        return _load_root(path, obj, limits)
    if isinstance(obj, dict) and "program" in obj:
        return None, [(Path(path).stem, *_load_entry(path, obj, limits))]
    try:
        return None, [(Path(path).stem, load_program(obj, limits), None, None)]
    except ProgramError as e:
        raise UsageError(f"{path}: {e.field}: {e.reason}") from None


def load_program_file(path: str, limits=None):
    """(program, inputs or None, finding or None) from a corpus entry, a corpus root (its
    representative variant) or a bare program file."""
    return _load_file(path, limits)[1][0][1:]


def load_corpus_variants(path: str, limits=None):
    """Every program of a corpus file: [(name, program, inputs, finding)] (one for a plain entry,
    named by its file; a root's variants, representative first)."""
    return _load_file(path, limits)[1]


def load_corpus_root(path: str, limits=None):
    """(CorpusRoot or None for a plain entry, its variants as load_corpus_variants gives them)."""
    return _load_file(path, limits)


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


def _before_fix(finding) -> bool:
    """Whether the installed release comes before the one its root was bisected as fixed in: there the behaviour
    is still known (a campaign on that release counts it, not reports it as new)."""
    r = finding.releases
    if r is None or r.fixed_in is None:
        return False
    got = releases.parse(releases.installed(r.framework))
    return got is not None and got < releases.parse(r.fixed_in)


def load_known(paths: list[str], limits=None):
    """The findings of regression-corpus entries (`run --known`): each path a corpus entry or a
    directory of them. A directory's status.json lists fixed keys, roots or "root/variant"s under "fixed": those entries
    are not known behaviours (a recurrence is a regression) and are left out, except on a release before the one
    the root was bisected as fixed in (its `releases`), where the behaviour is still there. A corpus root gives
    every variant's finding. Each finding is returned with `tracked` set to its file's name."""
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
            if f.name in names:
                continue
            names.add(f.name)
            for name, _, _, finding in load_corpus_variants(str(f), limits):
                if finding is None:
                    raise UsageError(f"{f}: finding: a known behaviour needs a corpus entry with a finding")
                if ("|".join(finding.key()) in fixed or f.stem in fixed or f"{f.stem}/{name}" in fixed) and not (
                        _before_fix(finding)):
                    continue
                out.append(finding.model_copy(update={"tracked": f.name}))
    return out
