"""Cross-framework oracles: PyTorch against JAX (and eager against compiled PyTorch).

Pure functions over observations; they import no framework.

- Values: outputs, gradients and second-order gradients compared with the gradient
  oracle (`oracles.gradients.compare`), by default with the same-dtype (tight) tolerance.
- Residuals: named value classes (classes holding a checkpoint-named value) compared
  exactly, as multisets. Unnamed residuals legitimately differ between frameworks (torch's
  sin saves its input where JAX saves cos(x)), so they are never compared across frameworks.
  The same derivative-rule difference also reaches named classes when a name tags a value
  that an op saves for its own backward (`name(x)` then `sin`). Given the program, the
  comparison is restricted to the classes the *policy* decides: named values inside
  checkpoint regions that an enclosing policy saves (`policy_named`), which both
  frameworks must keep if their backward reads them. A class that also holds a value
  any pipeline may keep for reasons of its own (a program input, a value outside every
  region, a region's or custom_vjp block's argument or result: `conformance.ir.nodes.region_context`)
  is left out, since value-equal aliases would otherwise make a partitioner's legitimate choice
  (save the input, recompute its broadcast) look like a dropped named residual. Across frameworks (not between eager and
  compiled PyTorch), so is a class read by an elementwise nonlinear op (sin, square, ...) under a
  policy that can save unnamed values (`derivative_factor_reads`): JAX then saves that op's
  derivative factor (cos(x)) and its backward no longer reads x, where PyTorch's sin saves x
  itself. Without the program, all named classes are compared (strict; use it between pipelines of one framework).
"""
from __future__ import annotations

from conformance.ir.nodes import (
    DERIVATIVE_CTX,
    Checkpoint,
    Cond,
    CustomVJP,
    Jit,
    Op,
    Scan,
    base_id,
    checkpoint_name_of,
    input_elements,
    is_name,
    walk,
)
from conformance.ir.observation import Observation
from conformance.ir.ops import OPS
from conformance.ir.policy import decide, judged_by_meaning, saves_unnamed
from conformance.ir.program import Program
from conformance.ir.verdict import Verdict
from oracles import gradients, residuals


def compare_grads(program: Program, torch_obs: Observation, jax_obs: Observation,
                  mode: str = "tight", values: dict | None = None, values_missing: str | None = None) -> Verdict:
    """Values of one pipeline against another's, in the same dtype. `tight` (default): two
    frameworks' kernels differ by rounding only, which the depth-aware same-dtype bound
    absorbs on bounded programs; `loose` is the float64-reference tolerance."""
    v = gradients.compare(program, torch_obs, jax_obs, mode, values, values_missing)
    if v.status == "fail":
        v.error_type = "cross_value"
    return v


def policy_named(program: Program, names_only: bool = True) -> set[str]:
    """Ids of name ops (every op, with names_only=False) inside checkpoint regions for which some
    enclosing policy decides 'save' (or 'offload'). With nested regions the frameworks resolve
    conflicting levels differently (that is a declared semantic difference, to be reported, so
    both the innermost and the outer levels count)."""
    out: set[str] = set()
    types = program.types()

    def visit(body, stack):
        for s in body:
            if isinstance(s, Op):
                if (
                    (is_name(s) or not names_only)
                    and stack
                    and judged_by_meaning(stack, bool(program.diff.batch))
                    and any(
                        decide(p, s.op, checkpoint_name_of(s), False, input_elements(s, types)) != "recompute"
                        for p in stack
                    )
                ):
                    out.add(s.out)
            elif isinstance(s, Checkpoint):
                visit(s.body, stack + [s.policy])
            elif isinstance(s, CustomVJP):
                visit(s.fwd, stack)
            elif isinstance(s, (Scan, Jit)):
                visit(s.body, stack)
            elif isinstance(s, Cond):
                for b in s.branches:
                    visit(b, stack)
    visit(program.body, [])
    return out


def derivative_factor_reads(program: Program) -> set[str]:
    """Ids read by an elementwise nonlinear op (tangent 'diagonal') that some enclosing policy
    may save unnamed values around: whether such an id is saved depends on each framework's
    derivative rule (JAX keeps cos(x) for sin(x) when the policy saves it, PyTorch keeps x),
    not on the policy's decision for the id."""
    policies, _ = program.analysis().contexts
    return {a for s, _, _, ctx in walk(program.body)
            if isinstance(s, Op) and ctx not in DERIVATIVE_CTX and OPS[s.op].tangent == "diagonal"
            and any(saves_unnamed(p) for p in policies.get(s.out, [])) for a in s.args}


def _restrict(obs: Observation, ids: set[str], exempt: set[str]) -> Observation:
    o = obs.model_copy(deep=True)
    o.residuals = [r for r in (obs.residuals or [])
                   if r.names and ids & set(map(base_id, r.cls)) and not exempt & set(map(base_id, r.cls))]
    return o


def _unnamed_within(compiled: Observation, eager: Observation, program: Program, live: set[str],
                    exempt: set[str]) -> Verdict | None:
    """Compiled against eager PyTorch (one framework's rules), unnamed values: every saved class
    the compiled pipeline keeps that holds a live op output some enclosing policy decides to save
    must be among eager's classes. Eager SAC caches every such output, where the partitioner
    keeps only those its backward reads, so the converse is not judged (nor is what the
    partitioner keeps instead of a saved value: cos(v) for sin(v) holds no policy-saved output)."""
    ids = policy_named(program, names_only=False) & live

    def classes(o):
        return {tuple(r.cls) for r in o.residuals if not r.names and ids & set(map(base_id, r.cls))
                and not exempt & set(map(base_id, r.cls))}
    extra = classes(compiled) - {tuple(r.cls) for r in eager.residuals}
    if not extra:
        return None
    detail = {"extra_saved": sorted("/".join(c) for c in extra), "missing_saved": [], "scope": "policy_saved_unnamed",
              "saved": residuals.describe(compiled.residuals), "reference_saved": residuals.describe(eager.residuals)}
    detail["causes"] = residuals.causes(program, detail, compiled.pipeline)
    return Verdict(check="residuals", pipeline=compiled.pipeline, reference=eager.pipeline, status="fail",
                   error_type="extra", detail=detail)


def compare_residuals(torch_obs: Observation, jax_obs: Observation,
                      program: Program | None = None, across: bool = True) -> Verdict:
    """Named residual classes must agree exactly (restricted to policy-decided names when
    the program is given, and to live values: eager PyTorch runs dead code, and its selective
    checkpointing caches a dead value its policy names, where JAX and torch.compile drop the dead
    code). `across`: the two run different frameworks, whose derivative rules differ (False: eager
    against compiled PyTorch, one framework's rules)."""
    if program is not None and torch_obs.residuals is not None and jax_obs.residuals is not None:
        live = program.analysis().live
        ids = policy_named(program) & live
        _, exempt = program.analysis().contexts
        if across:
            exempt = exempt | derivative_factor_reads(program)
        v = residuals.compare(_restrict(torch_obs, ids, exempt), _restrict(jax_obs, ids, exempt),
                              named_only=True, program=program)
        v.detail = {**v.detail, "scope": "policy_named"} if v.detail else v.detail
        if v.status == "pass" and not across:
            return _unnamed_within(torch_obs, jax_obs, program, live, exempt) or v
        return v
    return residuals.compare(torch_obs, jax_obs, named_only=True)
