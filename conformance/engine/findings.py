"""Findings, corpus entries and exact input values (schemas exported as JSON Schema)."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conformance.errors import field_path
from conformance.ir.dtypes import np_dtype
from conformance.ir.program import Program
from conformance.ir.verdict import Triage

SCHEMA_VERSION = 1


class InputValue(BaseModel):
    """An exact input array: float32 values are exact in JSON's float64 and read back exactly."""
    model_config = ConfigDict(extra="forbid")
    dtype: str
    shape: list[int]
    data: Any  # nested lists (or a bare number for rank 0)


def encode_inputs(values: dict[str, np.ndarray]) -> dict[str, InputValue]:
    return {k: InputValue(dtype=str(v.dtype), shape=list(v.shape), data=np.asarray(v).astype(np.float64).tolist())
            for k, v in values.items()}


def decode_inputs(enc: dict[str, InputValue]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in enc.items():
        a = np.asarray(v.data, dtype=np.float64).astype(np_dtype(v.dtype))
        out[k] = a.reshape(v.shape)
    return out


class Seen(BaseModel):
    """One variant of a root behaviour: how many programs showed it, and when it was first seen."""
    model_config = ConfigDict(extra="forbid")
    count: int = 0
    first_seen: float | None = None  # seconds into the campaign


# What a finding lists its variants by (conformance.engine.roots.VARIANT_DIMENSIONS derives from this).
# constructs: the program's features that are not variant dimensions (a scan, a cond, a custom rule,
# a name): the variants of a root keyed on its evidence (a raise, a residual direction).
VARIANT_DIMENSIONS = ("pipelines", "labels", "policies", "constructs", "features")


class ReleaseRange(BaseModel):
    """What `bisect --all --write` found of a root: its short repro's answer on each release tried."""
    model_config = ConfigDict(extra="forbid")
    framework: Literal["jax", "torch"]
    range: list[str] = Field(min_length=2, max_length=2)   # the releases bisected over, oldest first
    answers: dict[str, Literal["reproduces", "does not", "cannot run"]]
    first_seen: str | None = None    # the oldest release tried where it reproduces
    last_good: str | None = None     # the release before first_seen that does not reproduce (a regression)
    fixed_in: str | None = None      # the first release after the last that reproduces which does not
    verdict: str
    at: str                          # the day it was bisected

    @property
    def regression(self) -> bool:
        return self.last_good is not None

    def sentence(self) -> str:
        """What an issue text says of it."""
        if self.fixed_in:
            return f"Fixed in {self.framework} {self.fixed_in} (reproduces in {self.first_seen}; bisected {self.at})."
        if self.last_good:
            return (f"Regression in {self.framework} {self.first_seen} ({self.last_good} is good; bisected over "
                    f"{self.range[0]}..{self.range[1]} on {self.at}).")
        if self.first_seen:
            return (f"Present since the first release tried ({self.framework} {self.first_seen}; bisected over "
                    f"{self.range[0]}..{self.range[1]} on {self.at}).")
        return f"{self.verdict} (bisected {self.at})."


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    signature: str
    check: str
    pipeline: str
    reference: str
    error_type: str = ""
    features: list[str]
    program: dict
    program_hash: str
    inputs: dict[str, InputValue] = Field(default_factory=dict)
    detail: dict = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    flags: dict[str, Any] = Field(default_factory=dict)
    device: str = "cpu"
    count: int = 1
    shrunk: bool = False
    shrink_steps: int = 0
    original_size: int | None = None
    size: int | None = None
    expectation: str | None = None
    first_seen: float | None = None   # seconds into the campaign
    # The `seq` of the last result record (results.jsonl) whose program `count` includes (a known
    # behaviour it showed): findings.json is rewritten for counts only every few seconds, so a resumed
    # campaign counts the records after it again (Campaign.restore). Not written to corpus entries.
    counted_seq: int | None = None
    # Keys (check, pipeline, reference, error type) on which the shrunk program fails the same way:
    # the same root behaviour on sibling pipelines (remat3 and remat3+cvjp3, their :jit forms...).
    reproduces: list[list[str]] = Field(default_factory=list)
    # The regression-corpus entry (`run --known`) this finding stands for; None for a behaviour
    # this campaign found. A tracked finding's count is the programs of this run that showed it.
    tracked: str | None = None
    # The root behaviour (conformance.engine.roots.root_key of the shrunk program), its variants by
    # dimension (pipelines, labels, policies, features -> Seen), its title and its class.
    root: str = ""
    title: str = ""
    variants: dict[str, dict[str, Seen]] = Field(default_factory=dict)
    triage: Triage | None = None
    releases: ReleaseRange | None = None   # a tracked root's bisection over releases (its corpus file's)

    def behaviour_pipelines(self) -> list[str]:
        """Where this behaviour reproduces: its own pipeline and its siblings'."""
        return list(dict.fromkeys([self.pipeline] + [k[1] for k in self.reproduces]))

    def key(self) -> tuple[str, str, str, str]:
        return (self.check, self.pipeline, self.reference, self.error_type)

    def core_features(self) -> set[str]:
        return set(signature_features(self.features))


class CorpusEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    program: dict
    inputs: dict[str, InputValue]
    finding: Finding | None = None
    versions: dict[str, str] = Field(default_factory=dict)


ROOT_SCHEMA_VERSION = 2


class CorpusVariant(CorpusEntry):
    """One program of a root: a finding of one of its variants (pipeline, label, policy...)."""
    name: str                        # the file name of the entry it was, or a new name
    finding: Finding


class CorpusRoot(BaseModel):
    """A regression-corpus root: one behaviour, its class, and every program known to show it.
    The first variant is the representative (its program is the one a repro and an issue show)."""
    model_config = ConfigDict(extra="forbid")
    schema_version: int = ROOT_SCHEMA_VERSION
    root: str                        # a short slug, the entry's file name without .json
    title: str                       # the behaviour, as an upstream issue would title it
    triage: Triage
    reference_why: str = ""          # what the reference is and why it is the reference
    replaces: list[str] = Field(default_factory=list)   # the corpus entries it was regrouped from
    variants: list[CorpusVariant] = Field(min_length=1)
    releases: ReleaseRange | None = None   # the releases it was bisected over (`bisect --all --write`)

    def representative(self) -> CorpusVariant:
        return self.variants[0]


# Features a shrunk program keeps by accident rather than because the behaviour needs them
# (the shrinker always leaves some dtype; names nobody reads, layout ops...). They stay in a
# finding's `features` but not in its signature, so that one behaviour is one finding. Per-op
# features (op:<op>) serve expectations only; the op families (matmul, reduction...) sign.
INCIDENTAL_FEATURES = frozenset({"float32", "float64", "unread_name", "dup_names", "layout", "reduction",
                                 "prevent_cse_false"})


class ObservationDigest(BaseModel):
    """One pipeline's facts in a finding's detail.observations (what reports show)."""
    model_config = ConfigDict(extra="allow")
    error: str | None = None
    saved: list[str] | None = None
    saved_bytes: int | None = None
    grads: dict[str, Any] | None = None


def observations_problem(detail: dict) -> tuple[str, str] | None:
    """(field under detail.observations, reason) of the first digest a report could not show;
    None when every one is well formed. Corpus loading and report loading both refuse on it."""
    obs = detail.get("observations")
    if obs is None:
        return None
    if not isinstance(obs, dict):
        return "", "must be an object"
    for p, d in obs.items():
        try:
            ObservationDigest.model_validate(d)
        except ValidationError as e:
            return f".{p}.{field_path(e.errors()[0])}", e.errors()[0]["msg"]
    return None


# What a message says about one program's values rather than what went wrong, blanked in an error's root: a list of
# torch's fake tensors, a torch symbol's kind (u: unbacked int, zuf: unbacked float, s: size), and the harness's own
# note of what raised before saved-tensor hooks were left disabled (whatever raised, the hooks stay off: one cause).
_ROOT_VALUE_NAMES = {"fakes": "[FakeTensor...]", "syms": "<symbol>", "first": "", "floats": "floatN", "fs": "fN"}
_SYM = r"\b(?:zuf|zf|zb|u|s)N\b"
# (fake tensors, unbacked symbols however many, a float dtype however wide: bfloat16 and float32 read alike)
_ROOT_VALUES = re.compile(rf"(?P<fakes>\[FakeTensor\(.*?\)\])|(?P<syms>{_SYM}(?:, {_SYM})*)"
                          r"|(?P<first> \(it raised [\w.]+ first\))|(?P<floats>\bb?floatN\b)|(?P<fs>\bb?fN\b)")


_PATH_DIRS = re.compile(r"(?:/[\w.@+-]+)+/(?=[\w.@+-]+\.py\b)")   # the directories of an absolute .py path


def error_root(detail: dict) -> str | None:
    """What an error finding raised, as the root of its behaviour: the type and the first two
    lines of the message, numbers, shapes, float widths and addresses blanked (`float32[]`, `bfloat16[2]` and
    `float32[2,2]` read alike); for a message too short to tell roots apart, the framework frame that raised it
    (ErrorInfo.where).
    None for a missing error, or a short message whose raise site is unknown."""
    got = detail.get("got") if isinstance(detail, dict) else None
    if not isinstance(got, dict) or not isinstance(got.get("message"), str):
        return None
    message = got["message"]
    for tail in _MESSAGE_TAILS:   # (torch.fx's "While executing %node ..." names the harness's graph, not the raise)
        message = message.split(tail, 1)[0] if message.find(tail) > 0 else message
    lines = [x.strip() for x in message.strip().splitlines() if x.strip()][:2]
    text = _PATH_DIRS.sub("", " / ".join(lines))   # (a file a message names, wherever the checkout or release is)
    text = re.sub(r"0x[0-9a-fA-F]+|\d+(?:\s*,\s*\d+)*", "N", re.sub(r"\[[\d,\s]*\]", "[N]", text))
    text = _ROOT_VALUES.sub(lambda m: next(v for k, v in _ROOT_VALUE_NAMES.items() if m.group(k)), text)
    text = _effects_unordered(text)[:240]
    if len(text) >= 12:
        return f"{got.get('type', '')}: {text}"
    # a message too short to tell roots apart (a bare AssertionError): where the framework raised it
    return f"{got.get('type', '')}: raised in {got['where']}" if isinstance(got.get("where"), str) else None


# A verdict's detail keys that give context rather than what differed: the observations a report
# shows, notes, the other pipelines that also differ (they depend on which pipelines ran), and a
# residual difference's causes (read from the program and the saved sets the detail holds), and the statements an
# effect count splits into (`sites`: where the pipelines count per statement; the counts per kind are what differed).
DETAIL_CONTEXT = frozenset({"observations", "note", "status_differs_from", "also_differs_from", "causes", "sites"})
# Where a framework's message turns from what went wrong into where (tracebacks echo the harness's
# own source lines, which move with every edit) or advice.
_MESSAGE_TAILS = ("\nfrom user code:", "\nTip:", "\nSet TORCH_LOGS", "\n\nWhile executing",
                  "Suspected Python Code Location:", "Dimension numbers:",   # (XLA: the harness's files and lines;
                  # a debug dump whose link XLA spells either way)
                  "\n Equation:", "\nEquation:")   # (JAX: the equation it failed on, the program's own jaxpr)


def _effects_unordered(text: str) -> str:
    """JAX's effects on refs as a set, not in the order it iterated them: a set's elements sorted ({WriteEffect(...),
    ReadEffect(...)}, either way round), and the one effect it names of a set (`JaxprInputEffect` Write<Var...> or
    Read<Var...> for one program) as Effect<Var...>."""
    text = re.sub(r"\{((?:\w+\(Var\(id=[?N]\)[^{}]*?\), )+\w+\(Var\(id=[?N]\)[^{}]*?\))\}",
                  lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", text)
    return re.sub(r"\b(?:Read|Write|Accum)(?=<Var\(id=)", "Effect", text)


def what_differed(detail):
    """A verdict's detail as its behaviour, not its numbers: context keys dropped (DETAIL_CONTEXT),
    every float blanked (tolerances and worst errors move with inputs and machines; which value
    differs, in which mode, stays), messages cut before tracebacks, addresses, object ids and
    spacing blanked."""
    if isinstance(detail, dict):
        return {str(k): what_differed(v) for k, v in sorted(detail.items()) if k not in DETAIL_CONTEXT}
    if isinstance(detail, (list, tuple)):
        return [what_differed(v) for v in detail]
    if isinstance(detail, float):
        return "<float>"
    if isinstance(detail, str):
        for tail in _MESSAGE_TAILS:
            detail = detail.split(tail)[0]
        detail = re.sub(r"\bid=\d+", "id=?", detail)   # a Python object's id (JAX prints Var(id=...))
        # a source location (JAX names the harness's own files: their checkout path and lines vary)
        detail = re.sub(r"(?:/[^\s:'\"()]+/)?([\w.]+\.py):\d+(?::\d+)?", r"\1:?", detail)
        detail = _effects_unordered(detail)
        return " ".join(re.sub(r"0x(?:[0-9a-fA-F]+|\u2026)", "0x?", detail).split())
    return detail


def detail_digest(detail) -> str:
    """A short digest of what_differed(detail): equal for two verdicts that differ the same way."""
    text = json.dumps(what_differed(detail), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def residuals_digest(residuals) -> str:
    """A short digest of a pipeline's canonical saved residuals (class, names, dtype, shape, copies
    of each): what the residual oracles compare, so that a change in canonicalisation shows even
    where both sides of every comparison move alike."""
    text = json.dumps(sorted(f"{'/'.join(r.cls) or '?'}{r.names}:{r.dtype}{r.shape}x{r.copies}" for r in residuals))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def signature_features(features) -> list[str]:
    return sorted(f for f in set(features) - INCIDENTAL_FEATURES if not f.startswith("op:"))


def signature(check: str, pipeline: str, reference: str, error_type: str, features) -> str:
    return f"{check}|{pipeline}|{reference}|{error_type or '-'}|{'+'.join(signature_features(features))}"


def make_finding(verdict, program: Program, inputs: dict[str, np.ndarray], obs_versions: dict, flags: dict,
                 device: str) -> Finding:
    feats = sorted(program.features())
    return Finding(
        signature=signature(verdict.check, verdict.pipeline, verdict.reference, verdict.error_type or "", feats),
        check=verdict.check,
        pipeline=verdict.pipeline,
        reference=verdict.reference,
        error_type=verdict.error_type or "",
        features=feats,
        program=program.to_json_obj(),
        program_hash=program.content_hash(),
        inputs=encode_inputs(inputs),
        detail=verdict.detail,
        versions=obs_versions,
        flags=flags,
        device=device,
        expectation=verdict.expectation,
        size=program.size(),
    )
