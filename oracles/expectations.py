"""Expectations as data: known divergences and expected errors.

Each entry is keyed by pipeline (glob), framework version range (packaging specifiers),
device, dtype and program features (all of `features`, none of `absent_features`, at least one
of `any_features` where given), and says one of
  raises(type, regex)        the pipeline must raise an error matching both,
  diverges(check, reason)    a failure of `check` is known and reported as expected,
  unsupported(reason)        the pipeline does not handle such programs.
Entries that never match, or whose divergence no longer happens, are reported as stale.
An entry may say what kind of claim it is (`triage`, as a corpus root's: class bug, documented,
question or harness, a reason and links): a `question` entry encodes a behaviour upstream has
not documented (a proposal, a probe), not a documented one. Without it the entry is unclassified.
"""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conformance.errors import UsageError
from conformance.files import InputRefused, read_text
from conformance.ir.verdict import Check, Triage

DEFAULT_FILE = Path(__file__).with_name("expectations.json")


class Raises(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str          # regex over the error type name
    regex: str         # regex searched in the message


class Diverges(BaseModel):
    model_config = ConfigDict(extra="forbid")
    check: Check
    reference: str | list[str] | None = None   # restrict to these references (pipeline names, 'policy')
    error_regex: str | None = None  # for check 'error': only errors whose "type: message" matches
    reason: str
    link: str | None = None

    def concerns(self, reference: str) -> bool:
        r = self.reference
        return r is None or reference == r or (isinstance(r, list) and reference in r)


class Unsupported(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    pipelines: list[str]                       # globs over pipeline names
    versions: dict[str, str] = Field(default_factory=dict)   # framework -> specifier set
    devices: list[str] | None = None
    dtypes: list[str] | None = None
    features: list[str] = Field(default_factory=list)        # all required
    absent_features: list[str] = Field(default_factory=list)  # none allowed
    any_features: list[str] = Field(default_factory=list)     # at least one, where given
    # framework flags the run must have had (e.g. {"jax_custom_vjp3": false}): what a framework
    # requires of a program is declared by the flags it needs, so every pipeline run with those
    # flags (test-only ones included) matches
    flags: dict[str, bool] = Field(default_factory=dict)
    raises: Raises | None = None
    diverges: Diverges | None = None
    unsupported: Unsupported | None = None
    verified_by: str | None = None   # how the claim was checked (a script, a test)
    # what kind of claim it is ({"class": "bug"|"documented"|"question"|"harness", "reason": ...});
    # None: unclassified (entries written before the field)
    triage: Triage | None = None

    @model_validator(mode="after")
    def _one(self):
        n = sum(x is not None for x in (self.raises, self.diverges, self.unsupported))
        if n != 1:
            raise ValueError("exactly one of raises, diverges, unsupported")
        for fw, spec in self.versions.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier as e:
                raise ValueError(f"versions.{fw}: {e}") from None
        if self.diverges and self.diverges.error_regex is not None:
            if self.diverges.check != "error":
                raise ValueError("diverges.error_regex: only for check 'error' (it matches the error raised)")
            try:
                re.compile(self.diverges.error_regex)
            except re.error as e:
                raise ValueError(f"diverges.error_regex: bad regex: {e}") from None
        if self.raises:
            for f in ("type", "regex"):
                try:
                    re.compile(getattr(self.raises, f))
                except re.error as e:
                    raise ValueError(f"raises.{f}: bad regex: {e}") from None
        return self

    @property
    def kind(self) -> str:
        return "raises" if self.raises else "diverges" if self.diverges else "unsupported"

    def matches(self, pipeline: str, versions: dict[str, str], device: str, dtypes: set[str],
                features: set[str], flags: dict | None = None) -> bool:
        if not any(fnmatch.fnmatchcase(pipeline, g) for g in self.pipelines):
            return False
        if any((flags or {}).get(k, False) != v for k, v in self.flags.items()):
            return False
        for fw, spec in self.versions.items():
            v = versions.get(fw)
            if v is None:
                return False
            try:
                if Version(v) not in SpecifierSet(spec):
                    return False
            except InvalidVersion:
                return False
        if self.devices is not None and device not in self.devices:
            return False
        if self.dtypes is not None and not (dtypes & set(self.dtypes)):
            return False
        if not set(self.features) <= features:
            return False
        if set(self.absent_features) & features:
            return False
        if self.any_features and not set(self.any_features) & features:
            return False
        return True


class ExpectationsError(UsageError, ValueError):
    """A bad expectations file: a usage error of every command that reads one (exit 2, one line
    naming the file and field)."""

    def __init__(self, file: str, field: str, reason: str):
        super().__init__(f"{file}: {field}: {reason}")
        self.file, self.field, self.reason = file, field, reason


class Expectations:
    def __init__(self, entries: list[Entry], source: str = "<memory>"):
        ids = [e.id for e in entries]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ExpectationsError(source, "id", f"duplicate ids {sorted(dup)}")
        self.entries = entries
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None = None) -> "Expectations":
        path = Path(path) if path else DEFAULT_FILE
        try:
            obj = json.loads(read_text(path))
        except InputRefused as e:
            raise ExpectationsError(str(path), "<file>", str(e).removeprefix(f"{path}: ")) from None
        except json.JSONDecodeError as e:
            raise ExpectationsError(str(path), f"line {e.lineno}", e.msg) from None
        except (RecursionError, ValueError) as e:
            raise ExpectationsError(
                str(path), "<file>", "nesting too deep" if isinstance(e, RecursionError) else str(e)
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
            raise ExpectationsError(str(path), "entries", "expected an object with a list 'entries'")
        if obj.get("schema_version", 1) != 1:
            raise ExpectationsError(str(path), "schema_version", f"{obj.get('schema_version')!r} is not readable "
                                                                 f"(this harness reads 1)")
        entries = []
        for k, raw in enumerate(obj["entries"]):
            try:
                entries.append(Entry.model_validate(raw))
            except ValidationError as e:
                err = e.errors()[0]
                loc = ".".join(str(x) for x in err["loc"])
                raise ExpectationsError(str(path), f"entries[{k}]{'.' + loc if loc else ''}", err["msg"]) from None
        return cls(entries, str(path))

    def matching(self, pipeline, versions, device, dtypes, features, flags=None) -> list[Entry]:
        return [e for e in self.entries if e.matches(pipeline, versions, device, dtypes, features, flags)]


def stale(expectations: Expectations, pipelines, hits: dict) -> list[dict]:
    """Entries that name a pipeline of the run but never matched a program, or matched and
    never fired (never raised; the divergence no longer happens). `hits`: id -> Counter of
    'fired' / 'idle'."""
    out = []
    for e in expectations.entries:
        if not any(fnmatch.fnmatchcase(p, g) for p in pipelines for g in e.pipelines):
            continue
        h = hits.get(e.id) or {}
        if not h:
            out.append({"id": e.id, "kind": e.kind, "why": "never matched a program in this run"})
        elif not h.get("fired"):
            what = "never raised" if e.raises else "the divergence no longer happens"
            out.append({"id": e.id, "kind": e.kind, "why": f"matched {h.get('idle', 0)} programs but {what}"})
    return out
