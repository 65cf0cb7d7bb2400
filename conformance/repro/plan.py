"""What a repro script runs and checks, mirroring the finding's verdict; pipeline roles and
settings come from the registry."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from conformance.ir.nodes import checkpoint_name_of, input_elements, primal_ops
from conformance.ir.ops import OPS
from conformance.ir.policy import decide, judged_by_meaning
from conformance.ir.program import Program
from conformance.ir.verdict import CHECK, CHECK_SPECS
from conformance.ir.verdict import NON_PIPELINE_REFERENCES as VERDICT_REFS
from conformance.pipelines import registry
from oracles.expectations import Expectations


class ReproError(ValueError):
    """A repro cannot be generated: the message names the input and the reason."""


@dataclass
class Plan:
    check: str
    pipeline: str
    reference: str
    run: list[str]
    expect_raises: tuple[str, str] | None
    expect_why: str


def _runs_in(p: str, fw: str) -> bool:
    return p in VERDICT_REFS or registry.runs_in(p, fw)


def _expected_raise(prog, pipeline: str, finding) -> tuple[tuple[str, str] | None, str]:
    if finding is not None and finding.pipeline == pipeline and isinstance(finding.detail.get("expected"), dict):
        e = finding.detail["expected"]
        return (e.get("type", ".*"), e.get("regex", "")), finding.expectation or ""
    import importlib.metadata as md
    versions = dict(finding.versions) if finding else {}
    for fw in registry.FRAMEWORKS:
        try:
            versions.setdefault(fw, md.version(fw))
        except md.PackageNotFoundError:
            pass
    dtypes = {t[1] for t in prog.types().values()}
    for e in Expectations.load().matching(pipeline, versions, finding.device if finding else "cpu", dtypes,
                                          set(prog.features())):
        if e.raises:
            return (e.raises.type, e.raises.regex), e.id
    return None, ""


def plan(prog, finding, fw: str, pipeline: str | None = None) -> Plan:
    """Which pipelines to run and which check to perform, mirroring the finding's check."""
    if fw not in registry.FRAMEWORKS:
        raise ReproError(f"--framework: must be one of {', '.join(registry.FRAMEWORKS)}, got {fw!r}")
    if pipeline is not None and not registry.runs_in(pipeline, fw):
        raise ReproError(f"--pipeline: {pipeline!r} is not a {fw} pipeline")
    none, value = registry.baseline(fw), registry.value_reference()
    if finding is None:
        check, pipe, ref = "gradient", pipeline or registry.repro_default(fw), none
    else:
        check, ref_f = finding.check, finding.reference
        if _runs_in(finding.pipeline, fw) and _runs_in(ref_f, fw):
            pipe, ref = pipeline or finding.pipeline, ref_f
        else:   # the finding is about another framework: the corresponding check here
            own = registry.residual_reference(fw)
            pipe = pipeline or own or registry.repro_default(fw)
            if check == "gradient":
                ref = none if registry.role_of(ref_f) == registry.BASELINE else value
            elif check == "residuals":
                ref = own if (own and pipe != own and ref_f != "policy") else "policy"
            elif check == "custom_rule":
                ref = own if own and pipe != own else none
            elif check == "residual_report":
                raise ReproError(f"--framework: the residual_report check is JAX's own report; {fw} has none")
            else:
                ref = "expectations"
        if ref == pipe and check != "error":
            raise ReproError(f"--pipeline: {pipe!r} is the finding's reference; pick another pipeline")
    expect, why = (None, "")
    if check == "error":
        expect, why = _expected_raise(prog, pipe, finding)
    if ref in VERDICT_REFS:
        run = [pipe] if (check != "error" or pipe == value) else [pipe, value]
    else:
        run = [ref, pipe]
    return Plan(check, pipe, ref, list(dict.fromkeys(run)), expect, why)


def settings(p: str, fw: str, finding) -> dict:
    """How the script runs pipeline p (its registry settings; a finding's recorded JAX flags)."""
    try:
        s = registry.spec(p)
    except registry.UnknownPipeline:
        raise ReproError(f"--pipeline: unknown pipeline {p!r}") from None
    if fw == "jax":
        flags = s.flags if s.framework == "jax" else registry.spec(registry.residual_reference("jax")).flags
        if finding is not None and finding.pipeline == p and finding.flags:
            flags = {k: v for k, v in finding.flags.items() if k.startswith("jax_")}
        return {"remat": s.remat, "f64": s.f64, "jit": registry.jitted(p), "flags": flags, "shard_map": s.shard_map,
                **({"sharded": True} if s.sharded else {})}
    return {"remat": s.remat, "f64": s.f64, "prefer": s.prefer, "backend": s.compile, "partitioner": s.partitioner,
            "memory_budget": s.memory_budget, **{k: getattr(s, k) for k in registry.TORCH_OPTIONS}}


def must_not_save(prog: Program) -> list[str]:
    """Values every enclosing policy says to recompute (the policy check of the script)."""
    policies, exempt = prog.analysis().contexts
    types = prog.types()
    out = []
    for vid, s in primal_ops(prog).items():
        if vid in exempt or not policies.get(vid) or not judged_by_meaning(policies[vid], bool(prog.diff.batch)):
            continue
        batched = OPS[s.op].batched([types[a][0] for a in s.args])
        n = input_elements(s, types)
        if all(decide(p, s.op, checkpoint_name_of(s), batched, n) == "recompute" for p in policies[vid]):
            out.append(vid)
    return sorted(out)


# Each check's sentence (conformance.ir.verdict.CHECK_SPECS), and the two that depend on the reference.
_SENTENCE = {
    **{c.name: c.sentence for c in CHECK_SPECS},
    "residuals:policy": "{P} saves a value that its checkpoint policy says to recompute.",
    "error:expect": "{P} must raise an error matching {E} ({W}) but does not.",
}


def summary(finding, pl: Plan, fw: str) -> str:
    key = pl.check + (":policy" if pl.check == "residuals" and pl.reference == "policy" else "") + (
        ":expect" if pl.check == "error" and pl.expect_raises else "")
    s = _SENTENCE.get(key, _SENTENCE.get(pl.check, "")).format(
        P=pl.pipeline,
        R=pl.reference,
        E=pl.expect_raises and f"type /{pl.expect_raises[0]}/ message /{pl.expect_raises[1]}/",
        W=pl.expect_why,
    )
    lines = [f"Check: [{pl.check}] {pl.pipeline} vs {pl.reference}. {s}",
             f"Evidence: {CHECK[pl.check].evidence}."]
    if finding is not None:
        lines.insert(
            0,
            f"Finding: [{finding.check}] {finding.pipeline} vs {finding.reference}"
            f"{' (' + finding.error_type + ')' if finding.error_type else ''}; program {finding.program_hash}",
        )
        if not registry.runs_in(finding.pipeline, fw):
            lines.append(f"The finding is about {finding.pipeline}; this script runs the same program under {fw} "
                         f"and performs the corresponding check, for comparison.")
        lines.append("Program features: " + ", ".join(finding.features))
    return "\n".join(textwrap.fill(line, 96, subsequent_indent="  ") for line in lines)


def seen(finding, fw: str) -> tuple[str, list[str]]:
    """What the harness saw on this framework's pipelines: (versions, lines)."""
    if finding is None:
        return "", []
    obs = finding.detail.get("observations") or {}
    lines = []
    for p, d in obs.items():
        if not registry.runs_in(p, fw):
            continue
        if d.get("error"):
            lines.append(f"{p}: {d['error'][:150]}")
        if d.get("saved") is not None:
            lines.append(f"{p}: saved {d['saved']}"[:200])
    vs = ", ".join(f"{k} {v}" for k, v in sorted(finding.versions.items()) if k != "numpy")
    return vs, [line.replace("\n", " ") for line in lines]


def frameworks_for(finding) -> list[str]:
    """Frameworks a finding's repro can be emitted for (the finding's own first)."""
    own = registry.framework_of(finding.pipeline) if finding is not None else "jax"
    own = own if own in registry.FRAMEWORKS else "jax"
    return [own] + [f for f in registry.FRAMEWORKS if f != own]
