"""`remat-conformance repro`: a standalone Python script that reproduces one finding.

The script imports only the framework (jax or torch), numpy and the standard library. It
builds the shrunk program as straight-line code (checkpoint regions as functions passed to
`jax.checkpoint` / `torch.utils.checkpoint.checkpoint` with a SAC policy, custom_vjp blocks
as `jax.custom_vjp` / `torch.autograd.Function`), embeds the exact inputs, runs the
finding's pipeline and its reference with the exact flags, prints both sides (values,
saved residuals, errors, what custom rules saw) and performs the same check as the
harness's oracle. Exit status: 0 conforms (fixed), 1 reproduces, 3 inconclusive.

The emitter imports no framework: a report can embed scripts for both frameworks.
"""
from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conformance.jax_names import OP_PRIMS as JAX_OP_PRIMS, VARIANT_FLAGS as JAX_VARIANT_FLAGS

COMMAND = "repro"
TEMPLATES = Path(__file__).with_name("templates")

# Same as torch_pipelines.OP_ATEN, as source text.
TORCH_OP_ATEN = {
    "sin": ("A.sin",), "cos": ("A.cos",), "tanh": ("A.tanh",), "exp": ("A.exp",), "sigmoid": ("A.sigmoid",),
    "square": ("A.pow", "A.square"), "neg": ("A.neg",), "scale": ("A.mul",), "add": ("A.add",),
    "sub": ("A.sub",), "mul": ("A.mul",), "matmul": ("*DOTS",), "sum": ("A.sum",), "mean": ("A.mean",),
    "transpose": ("A.permute",), "reshape": ("A.view", "A._unsafe_view", "A.reshape"),
    "broadcast": ("A.expand",), "name": ("torch.ops.rc.tag",),
}
FRAMEWORKS = ("jax", "torch")
_GENERATED = re.compile(r"^(region|block|Block|ctx|policy|nd|ct)_?\d+$")
_RESERVED = {"jax", "jnp", "np", "torch", "A", "DOTS", "DOTS_NO_BATCH", "partial", "checkpoint", "log", "dt",
             "program", "loss_fn", "run", "tag", "TAG", "CONST", "INPUTS", "DIFF", "sys", "re", "os", "env",
             "inputs", "sac", "both", "checkpoint_name", "itertools", "Counter", "faulthandler", "LOG", "NAMES",
             "REMAT", "F64", "PREFER", "all_values", "main", "res", "cts", "ctx", "torch_checkpoint",
             "CheckpointPolicy", "create_selective_checkpoint_contexts", "compiled", "Saved", "identify"}


class ReproError(ValueError):
    """A repro cannot be generated: the message names the input and the reason."""


# ---------------------------------------------------------------------------------------------
def _names(prog) -> dict[str, str]:
    from conformance.ir import walk, Op, Checkpoint, CustomVJP
    ids = [i.id for i in prog.inputs]
    for s, _, _, _ in walk(prog.body):
        if isinstance(s, Op):
            ids.append(s.out)
        elif isinstance(s, CustomVJP):
            ids += list(s.cts)
    out, used = {}, set()
    for k, i in enumerate(ids):
        n = i if (i.isidentifier() and not keyword.iskeyword(i) and i not in _RESERVED
                  and not _GENERATED.match(i) and not i.startswith("_")) else f"v_{k}"
        while n in used:
            n += "_"
        used.add(n)
        out[i] = n
    return out


def _fmt_array(a: np.ndarray) -> str:
    data = a.astype(np.float64).tolist()
    return f"np.array({json.dumps(data)}, dtype=np.{a.dtype})" if a.ndim else f"np.array({float(a)!r}, dtype=np.{a.dtype})"


def _jax_policy(p, defs: list[str], counter: list[int]) -> str:
    cp = "jax.checkpoint_policies"
    k = p.kind
    names = lambda xs: ", ".join(json.dumps(x) for x in xs)
    simple = {"everything": "everything_saveable", "nothing": "nothing_saveable", "dots": "dots_saveable",
              "dots_no_batch": "dots_with_no_batch_dims_saveable"}
    if k in simple:
        return f"{cp}.{simple[k]}"
    if k == "save_only_names":
        return f"{cp}.save_only_these_names({names(p.names)})"
    if k == "save_any_names_but_these":
        return f"{cp}.save_any_names_but_these({names(p.names)})"
    if k == "save_anything_except_names":
        return f"{cp}.save_anything_except_these_names({names(p.names)})"
    if k == "both":
        return f"{cp}.save_from_both_policies({_jax_policy(p.a, defs, counter)}, {_jax_policy(p.b, defs, counter)})"
    if k == "offload_dots_no_batch":
        return f'{cp}.offload_dot_with_no_batch_dims("device", "pinned_host")'
    if k == "save_and_offload_names":
        return (f"{cp}.save_and_offload_only_these_names(names_which_can_be_saved={json.dumps(list(p.saved))}, "
                f"names_which_can_be_offloaded={json.dumps(list(p.offloaded))}, offload_src=\"device\", "
                f"offload_dst=\"pinned_host\")")
    if k == "ops":
        counter[0] += 1
        fn = f"policy_{counter[0]}"
        prims = sorted({pr for o in p.ops for pr in JAX_OP_PRIMS.get(o, ())})
        defs.append(f"def {fn}(prim, *_, **__):\n    \"\"\"Save outputs of IR ops {list(p.ops)}.\"\"\"\n"
                    f"    return prim.name in {set(prims) or 'set()'!r}\n")
        return fn
    raise ReproError(f"policy: unknown kind {k!r}")


def _torch_decide(p) -> str:
    k = p.kind
    tup = lambda xs: "(" + "".join(json.dumps(x) + ", " for x in xs).rstrip(" ") + ")"
    if k == "everything":
        return '"save"'
    if k == "nothing":
        return '"recompute"'
    if k == "dots":
        return '"save" if op in DOTS else "recompute"'
    if k == "dots_no_batch":
        return '"save" if op in DOTS_NO_BATCH else "recompute"'
    if k == "offload_dots_no_batch":
        return '"offload" if op in DOTS_NO_BATCH else "recompute"'
    if k == "save_only_names":
        return f'"save" if name in {tup(p.names)} else "recompute"'
    if k == "save_any_names_but_these":
        return f'"save" if name is not None and name not in {tup(p.names)} else "recompute"'
    if k == "save_anything_except_names":
        return f'"recompute" if name in {tup(p.names)} else "save"'
    if k == "save_and_offload_names":
        return f'"save" if name in {tup(p.saved)} else "offload" if name in {tup(p.offloaded)} else "recompute"'
    if k == "ops":
        ops = sorted({x for o in p.ops for x in TORCH_OP_ATEN.get(o, ())})
        return f'"save" if op in {{{", ".join(ops)}}} else "recompute"' if ops else '"recompute"'
    if k == "both":
        return f"both({_torch_decide(p.a)}, {_torch_decide(p.b)})"
    raise ReproError(f"policy: unknown kind {k!r}")


def _policy_text(p) -> str:
    """The policy as JAX spells it (for comments and the report's pseudo-code)."""
    k = p.kind
    if k in ("save_only_names", "save_any_names_but_these", "save_anything_except_names"):
        fn = {"save_only_names": "save_only_these_names", "save_any_names_but_these": "save_any_names_but_these",
              "save_anything_except_names": "save_anything_except_these_names"}[k]
        return f"{fn}({', '.join(repr(n) for n in p.names)})"
    if k == "both":
        return f"save_from_both_policies({_policy_text(p.a)}, {_policy_text(p.b)})"
    if k == "save_and_offload_names":
        return f"save_and_offload_only_these_names(saved={list(p.saved)}, offloaded={list(p.offloaded)})"
    if k == "ops":
        return f"save_ops({', '.join(repr(o) for o in p.ops)})"
    return {"everything": "everything_saveable", "nothing": "nothing_saveable", "dots": "dots_saveable",
            "dots_no_batch": "dots_with_no_batch_dims_saveable",
            "offload_dots_no_batch": "offload_dot_with_no_batch_dims"}.get(k, k)


class _Emitter:
    """Lowers the IR to straight-line source for one dialect: 'jax', 'torch' or 'pseudo'."""

    def __init__(self, prog, fw: str):
        self.prog, self.fw = prog, fw
        self.n = _names(prog)
        self.types = prog.types()
        self.defs: list[str] = []
        self.counter = [0]

    # -- ops ----------------------------------------------------------------------------------
    def op(self, s, nd: list[str] | None, literal_nondiff=None) -> str:
        a = [self.n[x] for x in s.args]
        o, p = s.op, s.params
        x = a[0] if a else ""
        if self.fw == "pseudo":
            if o in ("add", "sub", "mul"):
                return f"{x} {dict(add='+', sub='-', mul='*')[o]} {a[1]}"
            if o == "matmul":
                return f"{x} @ {a[1]}"
            if o == "scale":
                return f"{x} * {p['c']!r}"
            if o == "neg":
                return f"-{x}"
            if o == "name":
                return f"checkpoint_name({x}, {p['name']!r})"
            if o == "nondiff_scale":
                return f"{x} * nondiff[{p['index']}]"
            args = ", ".join(f"{k}={v!r}" for k, v in p.items())
            return f"{o}({x}{', ' + args if args else ''})"
        j = self.fw == "jax"
        lib = "jnp" if j else "torch"
        if o in ("sin", "cos", "tanh", "exp", "square"):
            return f"{lib}.{o}({x})"
        if o == "sigmoid":
            return f"jax.nn.sigmoid({x})" if j else f"torch.sigmoid({x})"
        if o == "neg":
            return f"-{x}" if j else f"torch.neg({x})"
        if o == "scale":
            return f"{x} * jnp.asarray({float(p['c'])!r}, {x}.dtype)" if j else f"{x} * {float(p['c'])!r}"
        if o == "nondiff_scale":
            c = repr(float(literal_nondiff[p["index"]])) if literal_nondiff is not None else nd[p["index"]]
            return f"{x} * jnp.asarray({c}, {x}.dtype)" if j else f"{x} * float({c})"
        if o in ("add", "sub", "mul"):
            return f"{x} {dict(add='+', sub='-', mul='*')[o]} {a[1]}"
        if o == "matmul":
            return f"{lib}.matmul({x}, {a[1]})"
        if o in ("sum", "mean"):
            if j:
                return f"jnp.{o}({x}, axis={p['axis']!r})"
            return f"torch.{o}({x})" if p["axis"] is None else f"torch.{o}({x}, dim={p['axis']!r})"
        if o == "transpose":
            return f"jnp.transpose({x}, {list(p['perm'])!r})" if j else f"torch.permute({x}, {list(p['perm'])!r})"
        if o == "reshape":
            return f"{lib}.reshape({x}, {tuple(p['shape'])!r})"
        if o == "broadcast":
            return f"{'jnp' if j else 'torch'}.broadcast_to({x}, {tuple(p['shape'])!r})"
        if o == "name":
            return f"checkpoint_name({x}, {json.dumps(p['name'])})" if j else f"tag({x}, {json.dumps(p['name'])})"
        raise ReproError(f"op: unknown op {o!r}")

    def zeros(self, vid: str) -> str:
        shp, dtype = self.types[vid]
        if self.fw == "jax":
            return f"jnp.zeros({tuple(shp)!r}, dt({dtype!r}))"
        return f"torch.zeros({tuple(shp)!r}, dtype=dt({dtype!r}))"

    @staticmethod
    def _tuple(xs: list[str]) -> str:
        return "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"

    # -- bodies ---------------------------------------------------------------------------------
    def body(self, stmts, ind: str, path: str, nd: list[str] | None) -> list[str]:
        from conformance.ir import Checkpoint, CustomVJP, Op
        lines = []
        for i, s in enumerate(stmts):
            p = f"{path}[{i}]"
            if isinstance(s, Op):
                lines.append(f"{ind}{self.n[s.out]} = {self.op(s, nd)}")
            elif isinstance(s, Checkpoint):
                lines += self.region(s, p, ind, nd)
            elif isinstance(s, CustomVJP):
                lines += self.block(s, p, ind)
        return lines

    def region(self, s, path: str, ind: str, nd) -> list[str]:
        self.counter[0] += 1
        k = self.counter[0]
        args = [self.n[a] for a in s.args]
        res = self._tuple([self.n[r] for r in s.results])
        if self.fw == "pseudo":
            head = f"{ind}with checkpoint(policy={_policy_text(s.policy)}" + (
                ", prevent_cse=False" if not s.prevent_cse else "") + f"):   # {path}"
            return [head] + self.body(s.body, ind + "    ", path + ".body", nd) + [
                f"{ind}    export {', '.join(self.n[r] for r in s.results)}"]
        fn = f"region_{k}"
        inner = self.body(s.body, "    ", path + ".body", nd)
        src = [f"def {fn}({', '.join(args)}):",
               f"    \"\"\"Checkpoint region {path}: policy {_policy_text(s.policy)}, prevent_cse={s.prevent_cse}.\"\"\""]
        src += inner + [f"    return {res}", ""]
        if self.fw == "jax":
            pol = _jax_policy(s.policy, self.defs, self.counter)
            self.defs.append("\n".join(src))
            return [f"{ind}{res} = checkpoint({fn}, policy={pol}, prevent_cse={s.prevent_cse})({', '.join(args)})"]
        self.defs.append("\n".join(src) + f"\nctx_{k} = partial(create_selective_checkpoint_contexts, "
                         f"sac(lambda op, name: {_torch_decide(s.policy)}))\n")
        return [f"{ind}{res} = checkpoint({fn}, ctx_{k}, {', '.join(args)})"]

    def block(self, s, path: str, ind: str) -> list[str]:
        self.counter[0] += 1
        k = self.counter[0]
        nd = [f"nd{i}" for i in range(len(s.nondiff))]
        args = [self.n[a] for a in s.args]
        results = [self.n[r] for r in s.results]
        resid = [self.n[r] for r in s.residuals]
        cts = [self.n[c] for c in s.cts]
        ndv = [repr(float(v)) for v in s.nondiff]
        if self.fw == "pseudo":
            opts = ", ".join(f"{o}=True" for o in ("symbolic_zeros", "optimize_remat") if getattr(s, o))
            out = [f"{ind}with custom_vjp({opts}{', ' if opts and ndv else ''}{'nondiff=[' + ', '.join(ndv) + ']' if ndv else ''}):   # {path}",
                   f"{ind}    def fwd({', '.join(args)}):"]
            out += self.body(s.fwd, ind + "        ", path + ".fwd", nd)
            out += [f"{ind}        return {self._tuple(results)}, residuals={self._tuple(resid)}",
                    f"{ind}    def bwd(residuals={self._tuple(resid)}, cotangents={self._tuple(cts)}):"]
            out += self.body(s.bwd, ind + "        ", path + ".bwd", nd)
            out += [f"{ind}        return {self._tuple([self.n[r] if r else 'zeros' for r in s.bwd_results])}",
                    f"{ind}    export {', '.join(results)}"]
            return out
        sz = s.symbolic_zeros
        fwd_body = self.body(s.fwd, "    " if self.fw == "jax" else "        ", path + ".fwd", nd)
        bwd_body = self.body(s.bwd, "    " if self.fw == "jax" else "        ", path + ".bwd", nd)
        ret = [self.n[r] if r else self.zeros(a) for r, a in zip(s.bwd_results, s.args)]
        opts = f"symbolic_zeros={sz}, optimize_remat={s.optimize_remat}, nondiff args {ndv or 'none'}"
        if self.fw == "jax":
            b = f"block_{k}"
            src = [f"# custom_vjp block {path} ({opts})",
                   f"def {b}_rule({', '.join(nd + args)}):",
                   f"    \"\"\"The fwd statements: (results, residuals).\"\"\""]
            src += fwd_body + [f"    return {self._tuple(results)}, {self._tuple(resid)}", "", "",
                               f"def {b}_fwd({', '.join(nd + args)}):"]
            if sz:
                src += [f"    log({path!r}, \"perturbed\", [{', '.join(f'bool({a}.perturbed)' for a in args)}])",
                        f"    {', '.join(args)} = {', '.join(f'{a}.value' for a in args)}"]
            src += [f"    return {b}_rule({', '.join(nd + args)})", "", "",
                    f"def {b}_bwd({', '.join(nd + ['res', 'cts'])}):"]
            if resid:
                src.append(f"    {self._tuple(resid)} = res")
            src.append(f"    {self._tuple(cts)} = cts")
            if sz:
                src.append(f"    log({path!r}, \"symbolic_zero_cts\", [{', '.join(f'isinstance({c}, jax.custom_derivatives.SymbolicZero)' for c in cts)}])")
                for c, r in zip(cts, s.results):
                    src.append(f"    {c} = {self.zeros(r)} if isinstance({c}, jax.custom_derivatives.SymbolicZero) else {c}")
            src += bwd_body + [f"    return {self._tuple(ret)}", "", ""]
            kw = "".join(f", {o}=True" for o in ("symbolic_zeros", "optimize_remat") if getattr(s, o))
            src += [f"def {b}_primal({', '.join(nd + args)}):", f"    return {b}_rule({', '.join(nd + args)})[0]", "", "",
                    f"def {b}(*args):",
                    f"    \"\"\"The custom_vjp function, built where it is called (as the harness does).\"\"\"",
                    f"    log({path!r})",
                    f"    f = jax.custom_vjp({b}_primal" + (f", nondiff_argnums={tuple(range(len(nd)))!r})" if nd else ")"),
                    f"    f.defvjp({b}_fwd, {b}_bwd{kw})", "    return f(*args)", ""]
            self.defs.append("\n".join(src))
            return [f"{ind}{self._tuple(results)} = {b}({', '.join(ndv + args)})"]
        cls = f"Block{k}"
        src = [f"class {cls}(torch.autograd.Function):",
               f"    \"\"\"custom_vjp block {path} ({opts}).\"\"\"",
               "", "    @staticmethod", f"    def forward(ctx, {', '.join(nd + args)}):"]
        if sz:
            src += [f"        flags = [bool(b) for b in ctx.needs_input_grad[{len(nd)}:]]",
                    f"        if any(flags):", f"            log({path!r}, \"perturbed\", flags)",
                    "        ctx.set_materialize_grads(False)   # symbolic zeros: None cotangents"]
        src += fwd_body + [f"        ctx.save_for_backward({', '.join(resid)})", f"        ctx.nondiff = {self._tuple(nd)}",
                           f"        return {results[0] if len(results) == 1 else ', '.join(results)}",
                           "", "    @staticmethod", f"    def backward(ctx, {', '.join(cts)}):"]
        if resid:
            src.append(f"        {self._tuple(resid)} = ctx.saved_tensors")
        if nd:
            src.append(f"        {self._tuple(nd)} = ctx.nondiff")
        if sz:
            src.append(f"        log({path!r}, \"symbolic_zero_cts\", [{', '.join(f'{c} is None' for c in cts)}])")
            for c, r in zip(cts, s.results):
                src.append(f"        {c} = {self.zeros(r)} if {c} is None else {c}")
        src += bwd_body
        src += [f"        return {', '.join(['None'] * len(nd) + ret)}", "", ""]
        self.defs.append("\n".join(src))
        call = f"{cls}.apply({', '.join(ndv + args)})"
        return [f"{ind}{', '.join(results)} = {call}"]

    # -- whole program ----------------------------------------------------------------------------
    def program(self) -> tuple[str, str]:
        lines = []
        for i in self.prog.inputs:
            if not i.diff:
                lines.append(f"    {self.n[i.id]} = CONST[{json.dumps(i.id)}]   # not differentiated")
        lines += self.body(self.prog.body, "    ", "body", None)
        lines.append(f"    return [{', '.join(self.n[o] for o in self.prog.outputs)}]")
        return "\n\n".join(d.rstrip() + "\n" for d in self.defs), "\n".join(lines)

    def values(self) -> str:
        """Flattened primal: every op outside bwd rules, nondiff constants inlined."""
        from conformance.ir import CustomVJP, Op
        lib = "jnp.asarray" if self.fw == "jax" else ""
        lines = [f"    {self.n[i.id]} = {lib}(inputs[{json.dumps(i.id)}])" for i in self.prog.inputs]
        keys = [i.id for i in self.prog.inputs]

        def visit(stmts, literal):
            from conformance.ir import Checkpoint
            for s in stmts:
                if isinstance(s, Op):
                    lines.append(f"    {self.n[s.out]} = {self.op(s, None, literal)}")
                    keys.append(s.out)
                elif isinstance(s, Checkpoint):
                    visit(s.body, literal)
                elif isinstance(s, CustomVJP):
                    visit(s.fwd, list(s.nondiff))
        visit(self.prog.body, None)
        lines.append("    env = {" + ", ".join(f"{json.dumps(k)}: {self.n[k]}" for k in keys) + "}")
        return "\n".join(lines)


def pseudo_code(program) -> str:
    """The program as readable pseudo-Python (for reports)."""
    from conformance.ir import Program
    prog = program if isinstance(program, Program) else Program.model_validate(program)
    e = _Emitter(prog, "pseudo")
    sig = ", ".join(f"{e.n[i.id]}: {i.dtype}{list(i.shape)}" + ("" if i.diff else " (no grad)") for i in prog.inputs)
    lines = [f"def f({sig}):"] + e.body(prog.body, "    ", "body", None)
    lines.append(f"    return {', '.join(e.n[o] for o in prog.outputs)}")
    tail = "grad of grad of sum(outputs)" if prog.diff.order == 2 else "grad of sum(outputs)"
    return "\n".join(lines) + f"\n# differentiated: {tail} w.r.t. " + ", ".join(e.n[i.id] for i in prog.diff_inputs())


# ---------------------------------------------------------------------------------------------
@dataclass
class Plan:
    check: str
    pipeline: str
    reference: str
    run: list[str]
    expect_raises: tuple[str, str] | None
    expect_why: str


def _framework(p: str) -> str:
    return p.split(":", 1)[0] if p != "ref:f64" else "any"


def _expected_raise(prog, pipeline: str, finding) -> tuple[tuple[str, str] | None, str]:
    if finding is not None and finding.pipeline == pipeline and isinstance(finding.detail.get("expected"), dict):
        e = finding.detail["expected"]
        return (e.get("type", ".*"), e.get("regex", "")), finding.expectation or ""
    from oracles.expectations import Expectations
    import importlib.metadata as md
    versions = dict(finding.versions) if finding else {}
    for fw in ("jax", "torch"):
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
    if fw not in FRAMEWORKS:
        raise ReproError(f"--framework: must be one of {', '.join(FRAMEWORKS)}, got {fw!r}")
    if pipeline is not None and _framework(pipeline) not in (fw, "any"):
        raise ReproError(f"--pipeline: {pipeline!r} is not a {fw} pipeline")
    none = f"{fw}:none"
    if finding is None:
        check, pipe, ref = "gradient", pipeline or ("jax:remat3" if fw == "jax" else "torch:eager-sac"), none
    else:
        check = finding.check
        same = _framework(finding.pipeline) in (fw, "any") and _framework(finding.reference) in (fw, "any", "expectations", "policy")
        ref_f = finding.reference
        if ref_f in ("expectations", "policy") or finding.reference.split(":")[0] in ("expectations", "policy"):
            same = same and True
        if same:
            pipe, ref = pipeline or finding.pipeline, ref_f
        else:
            pipe = pipeline or ("jax:remat2" if fw == "jax" else "torch:eager-sac")
            if check == "gradient":
                ref = none if ref_f.endswith(":none") else "ref:f64"
            elif check == "residuals":
                ref = "jax:remat2" if (fw == "jax" and pipe != "jax:remat2" and ref_f != "policy") else "policy"
            elif check == "custom_rule":
                ref = "jax:remat2" if fw == "jax" and pipe != "jax:remat2" else none
            else:
                ref = "expectations"
        if ref == pipe and check != "error":
            raise ReproError(f"--pipeline: {pipe!r} is the finding's reference; pick another pipeline")
    expect, why = (None, "")
    if check == "error":
        expect, why = _expected_raise(prog, pipe, finding)
    if ref in ("expectations", "policy"):
        run = [pipe] if (check != "error" or pipe == "ref:f64") else [pipe, "ref:f64"]
    else:
        run = [ref, pipe]
    return Plan(check, pipe, ref, list(dict.fromkeys(run)), expect, why)


def _flags(p: str, finding) -> dict:
    if finding is not None and finding.pipeline == p and finding.flags:
        return {k: v for k, v in finding.flags.items() if k.startswith("jax_")}
    if p in ("ref:f64", "jax:none"):
        return dict(JAX_VARIANT_FLAGS["remat2"])
    variant = p.split(":")[1]
    if variant not in JAX_VARIANT_FLAGS:
        raise ReproError(f"--pipeline: unknown JAX pipeline {p!r}")
    return dict(JAX_VARIANT_FLAGS[variant])


def _must_not_save(prog) -> list[str]:
    from conformance.ir import Op, walk
    from conformance.policy import decide
    from oracles.residuals import _region_context
    policies, exempt = _region_context(prog)
    types = prog.types()
    out = []
    for s, _, _, ctx in walk(prog.body):
        if not isinstance(s, Op) or ctx == "bwd" or s.out in exempt or not policies.get(s.out):
            continue
        batch = s.op == "matmul" and len(types[s.args[0]][0]) == 3
        name = s.params.get("name") if s.op == "name" else None
        if all(decide(p, s.op, name, batch) == "recompute" for p in policies[s.out]):
            out.append(s.out)
    return sorted(out)


_SENTENCE = {
    "gradient": "{P} computes outputs/gradients that differ from {R} beyond the tolerance "
                "(rematerialization must never change values).",
    "residuals:policy": "{P} saves a value that its checkpoint policy says to recompute.",
    "residuals": "{P} and {R} claim the same checkpoint policy but save different residuals.",
    "custom_rule": "The custom_vjp rules see different perturbed flags / symbolic-zero cotangents under {P} "
                   "than under {R}.",
    "error:expect": "{P} must raise an error matching {E} ({W}) but does not.",
    "error": "{P} raises an error where nothing should raise.",
    "crash": "{P} crashes the process.",
    "timeout": "{P} does not finish (timeout).",
}


def _summary(prog, finding, pl: Plan, fw: str) -> str:
    key = pl.check + (":policy" if pl.check == "residuals" and pl.reference == "policy" else "") + (
        ":expect" if pl.check == "error" and pl.expect_raises else "")
    s = _SENTENCE.get(key, _SENTENCE.get(pl.check, "")).format(
        P=pl.pipeline, R=pl.reference, E=pl.expect_raises and f"type /{pl.expect_raises[0]}/ message /{pl.expect_raises[1]}/",
        W=pl.expect_why)
    lines = [f"Check: [{pl.check}] {pl.pipeline} vs {pl.reference}. {s}"]
    if finding is not None:
        lines.insert(0, f"Finding: [{finding.check}] {finding.pipeline} vs {finding.reference}"
                        f"{' (' + finding.error_type + ')' if finding.error_type else ''}; program {finding.program_hash}")
        if _framework(finding.pipeline) not in (fw, "any"):
            lines.append(f"The finding is about {finding.pipeline}; this script runs the same program under {fw} "
                         f"and performs the corresponding check, for comparison.")
        lines.append("Program features: " + ", ".join(finding.features))
    import textwrap
    return "\n".join(textwrap.fill(l, 96, subsequent_indent="  ") for l in lines)


def _seen(finding, fw: str) -> tuple[str, list[str]]:
    if finding is None:
        return "", []
    obs = finding.detail.get("observations") or {}
    lines = []
    for p, d in obs.items():
        if _framework(p) not in (fw, "any"):
            continue
        if d.get("error"):
            lines.append(f"{p}: {d['error'][:150]}")
        if d.get("saved") is not None:
            lines.append(f"{p}: saved {d['saved']}"[:200])
    vs = ", ".join(f"{k} {v}" for k, v in sorted(finding.versions.items()) if k != "numpy")
    return vs, [l.replace("\n", " ") for l in lines]


def generate(prog, inputs: dict[str, np.ndarray] | None, finding=None, framework: str = "jax",
             pipeline: str | None = None, filename: str = "repro.py") -> str:
    """The standalone reproducer's source."""
    import jinja2
    from conformance import __version__
    from oracles.gradients import tolerance
    if inputs is None:
        from generators.programs import input_values
        inputs = input_values(prog, 0)
    pl = plan(prog, finding, framework, pipeline)
    e = _Emitter(prog, framework)
    defs, body = e.program()
    names = {i: s.params["name"] for i, s in _ops(prog).items() if s.op == "name"}
    rtol, atol = tolerance(prog, "tight" if pl.reference.endswith(":none") else "loose")
    flags = "{}"
    if framework == "jax":
        flags = "{\n" + "".join(f"    {json.dumps(p)}: {_py(_flags(p, finding))},\n" for p in pl.run) + "}"
    seen, seen_lines = _seen(finding, framework)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    src = env.get_template(f"repro_{framework}.py.j2").render(
        harness=__version__, summary=_summary(prog, finding, pl, framework), filename=filename,
        check=pl.check, pipeline=pl.pipeline, reference=pl.reference, run=pl.run, flags=flags,
        rtol=repr(rtol), atol=repr(atol), expect_raises=repr(pl.expect_raises), expect_why=pl.expect_why,
        timeout=300 if pl.check != "timeout" else 120, names=repr(names), must_not_save=repr(set(_must_not_save(prog)) or set()),
        seen=seen, seen_lines=seen_lines,
        inputs=[(k, _fmt_array(np.asarray(inputs[k]))) for k in [i.id for i in prog.inputs]],
        diff_ids=[e.n[i.id] for i in prog.diff_inputs()], defs=defs, body=body, values_body=e.values(),
        order2=prog.diff.order == 2, has_names=bool(names), blocks=_blocks(prog))
    # DIFF holds input ids (INPUTS keys); program() takes them by identifier, in the same order.
    src = src.replace(f"DIFF = {json.dumps([e.n[i.id] for i in prog.diff_inputs()])}",
                      f"DIFF = {json.dumps([i.id for i in prog.diff_inputs()])}")
    return src


def _blocks(prog) -> list[str]:
    from conformance.ir import CustomVJP, walk
    return [p for s, _, p, _ in walk(prog.body) if isinstance(s, CustomVJP)]


def _py(d: dict) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v!r}" for k, v in d.items()) + "}"


def _ops(prog):
    from conformance.ir import Op, walk
    return {s.out: s for s, _, _, ctx in walk(prog.body) if isinstance(s, Op) and ctx != "bwd"}


def frameworks_for(finding) -> list[str]:
    """Frameworks a finding's repro can be emitted for (the finding's own first)."""
    own = _framework(finding.pipeline) if finding is not None else "jax"
    own = "jax" if own == "any" else own
    return [own] + [f for f in FRAMEWORKS if f != own]


# ---------------------------------------------------------------------------------------------
def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("repro", help="write a standalone reproducer script for a finding",
                              description="Print (or write) a standalone Python script, importing only the "
                                          "framework and numpy, that reproduces a corpus entry's finding.")
    p.add_argument("file", metavar="ENTRY_OR_PROGRAM", help="corpus entry (corpus/<hash>.json) or bare program JSON")
    p.add_argument("--framework", choices=FRAMEWORKS, default=None,
                   help="framework of the script (default: the finding's)")
    p.add_argument("--pipeline", default=None, help="pipeline to run (default: the finding's)")
    p.add_argument("--seed", type=int, default=0, help="input seed for bare programs")
    p.add_argument("--out", default=None, help="write the script to FILE (default: stdout)")


def main(args) -> int:
    from conformance.cli import UsageError, load_program_file
    prog, inputs, finding = load_program_file(args.file)
    if inputs is None:
        from generators.programs import input_values
        inputs = input_values(prog, args.seed)
    fw = args.framework or frameworks_for(finding)[0]
    if args.pipeline is not None:
        from conformance import pipelines as reg
        if args.pipeline not in reg.known_names():
            raise UsageError(f"--pipeline: unknown pipeline {args.pipeline!r}; known: {', '.join(reg.known_names())}")
    try:
        src = generate(prog, inputs, finding, fw, args.pipeline,
                       filename=Path(args.out).name if args.out else "repro.py")
    except ReproError as e:
        raise UsageError(f"{args.file}: {e}") from None
    if args.out:
        try:
            Path(args.out).write_text(src)
        except OSError as e:
            raise UsageError(f"--out {args.out}: {e.strerror}") from None
        print(f"wrote {args.out} (run: python {args.out}; exit 1 while the discrepancy reproduces)")
    else:
        print(src, end="")
    return 0
