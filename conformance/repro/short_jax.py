"""The short JAX repro: the program as plain JAX (jax.checkpoint with its policy, jax.custom_vjp
with defvjp), the exact inputs, both flag settings, the evidence and the verdict."""
from __future__ import annotations

import json
import re

from conformance.ir.nodes import Checkpoint, CustomVJP, Op, is_name, walk
from conformance.ir.ops import IO_EFFECTS
from conformance.pipelines import registry
from conformance.pipelines.jax import table as jax_table
from conformance.repro.emit_jax import JaxEmitter
from conformance.repro.plan import ReproError, settings
from conformance.repro.short_common import (
    ShortDialect,
    array_text,
    dead_code_removed,
    error_sentence,
    fold_returns,
    header,
    needs_finding,
    used_helpers,
)
from oracles.gradients import tolerance

FLAG_NAMES = ("jax_remat3", "jax_custom_vjp3", "jax_custom_jvp3")
SZ = "jax.custom_derivatives.SymbolicZero"


class ShortJaxEmitter(ShortDialect, JaxEmitter):
    """Plain JAX: regions and rules as module-level functions; `probe` says what the custom rules
    record in SEEN ("events": distinct facts for custom_rule, "counts": trace counts, "": nothing)."""
    MODULE, ZEROS_DTYPE = "jnp", "{}"

    def __init__(self, prog, probe: str = "", remat_helper: bool = False, f64: bool = False):
        super().__init__(prog)
        self.probe, self.remat_helper, self.f64 = probe, remat_helper, f64

    def region(self, s, path, ind, nd):
        inner = s.body[0] if len(s.body) == 1 else None
        if (isinstance(inner, CustomVJP) and inner.args == s.args and inner.results == s.results and not inner.nondiff
                and not inner.non_differentiable and s.tree == "flat" and not s.static_flag and nd is None
                and s.state == "none"):
            self.block(inner, path + ".body[0]", ind)   # checkpoint of the custom rule itself
            kw = f"policy={jax_table.policy_source(s.policy)}" + jax_table.checkpoint_options_source(s, plain=True)
            ck = "checkpoint" if self.remat_helper else "jax.checkpoint"
            res = self.seq([self.n[r] for r in s.results])
            return [f"{ind}{res} = {ck}({self.last_block}, {kw})({', '.join(self.n[a] for a in s.args)})   # {path}"]
        k = self.next_id()
        fn = f"region_{k}"
        params, pro, ret, call, read = self.region_spelling(s, k)
        res = [self.n[r] for r in s.results]
        if s.tree == "flat" and not s.extras:   # (with state: a tuple, as with_state reads it)
            ret = self.tuple_(res) if s.state != "none" else self.seq(res)
        src = [f"def {fn}({', '.join(params)}):   # checkpoint region {path}"] + pro
        src += self.body(s.body, "    ", path + ".body", nd) + [f"    return {ret}"]
        folded = fold_returns("\n".join(src)).split("\n")
        kw = f"policy={jax_table.policy_source(s.policy)}" + jax_table.checkpoint_options_source(s, plain=True)
        ck = "checkpoint" if self.remat_helper else "jax.checkpoint"
        if len(folded) == 2 and s.tree == "flat" and not s.static_flag and s.state == "none" and not s.extras:
            expr = folded[1].strip()[len("return "):]
            line = f"{ind}{self.seq(res)} = {ck}(lambda {', '.join(params)}: {expr}, {kw})({', '.join(call)})"
            if len(line) <= 100:
                return [line]
        self.defs.append("\n".join(folded))
        kw = f"policy={jax_table.policy_source(s.policy)}" + jax_table.checkpoint_options_source(s, plain=True)
        ck = "checkpoint" if self.remat_helper else "jax.checkpoint"
        target = self.seq(res) if s.tree == "flat" and not s.extras else f"out_{k}"
        if s.state != "none":   # a scalar mutable state the region closes over (with_state)
            dtype = "float64" if self.f64 else self.types[s.results[0]][1]
            return [f"{ind}state_{k} = jax.new_ref(jnp.zeros((), jnp.{dtype}))",
                    f"{ind}{self.tuple_(res)} = read_state({ck}(with_state({s.state!r}, state_{k})({fn}), {kw})"
                    f"({', '.join(call)}), state_{k})"]
        lines = [f"{ind}{target} = {ck}({fn}, {kw})({', '.join(call)})"]
        if s.tree != "flat" or s.extras:   # (extras: the non-tensor values after the results, dropped)
            lines.append(f"{ind}{self.tuple_(res)} = {read}")
        return lines

    def count(self, ind, rule, what, extra=""):
        if self.probe == "counts":
            return [f'{ind}SEEN["{rule} {what}"] += 1']
        if self.probe == "events" and what == "fwd" and not extra:
            return [f'{ind}SEEN.add("{rule} fwd ran")']
        return []

    def block(self, s, path, ind):
        if s.tree != "flat" or s.perturbed_branch or s.residual_tree != "tuple":
            raise ReproError(f"{path}: a custom_vjp taking or returning pytrees has no short form (use --full)")
        if s.spelling not in ("defvjp", "custom_gradient"):
            raise ReproError(f"{path}: custom_vjp spelling {s.spelling!r} has no short form (use --full)")
        b = f"block_{self.next_id()}"
        nd, args, results, resid, cts, ndv = self.block_names(s)
        sig = ", ".join(nd + args)
        none = s.spelling == "defvjp"
        ret = [self.n[r] if r else "None" if none else self.zeros(a) for r, a in zip(s.bwd_results, s.args)]
        bwd = []
        if s.symbolic_zeros:
            flags = ", ".join(f"isinstance({c}, {SZ})" for c in cts)
            if self.probe == "events":
                bwd.append(f'    SEEN.add(f"{b} bwd: symbolic zero cotangents {{[{flags}]}}")')
            bwd += [f"    {c} = {self.zeros(r)} if isinstance({c}, {SZ}) else {c}" for c, r in zip(cts, s.results)]
        bwd += self.body(s.bwd, "    ", path + ".bwd", nd)
        if s.bwd_branch:
            bwd.append(f"    {ret[0]} = jnp.where(jnp.sum({cts[0]}) < 0, {ret[0]} * 2, {ret[0]})")
        fwd_body = self.body(s.fwd, "    ", path + ".fwd", nd)
        opts = "".join(f", {o}=True" for o in ("symbolic_zeros", "optimize_remat") if getattr(s, o))
        res = self.seq(resid) if resid else "None"
        if s.spelling == "custom_gradient":
            src = [f"@jax.custom_gradient   # custom rule {path}", f"def {b}({sig}):"]
            src += self.count("    ", b, "fwd") + fwd_body
            # (its vjp takes the outputs' cotangent as one value: a tuple where the rule returns several)
            src += [f"    def {b}_vjp({cts[0] if len(cts) == 1 else 'cts'}):"] + self.count("        ", b, "bwd")
            if len(cts) > 1:
                src.append(f"        {self.tuple_(cts)} = cts")
            src += ["    " + x for x in bwd] + [f"        return {self.tuple_(ret)}",
                                                f"    return {self.seq(results)}, {b}_vjp", ""]
            self.defs.append("\n".join(src))
        else:
            deco = f"@partial(jax.custom_vjp, nondiff_argnums={tuple(range(len(nd)))!r})" if nd else "@jax.custom_vjp"
            primal = [f"{deco}   # custom rule {path}", f"def {b}({sig}):"] + self.count("    ", b, "primal")
            fwd = [f"def {b}_fwd({sig}):"] + self.count("    ", b, "fwd", extra="sz" if s.symbolic_zeros else "")
            if s.symbolic_zeros:
                if self.probe == "events":
                    fwd.append(f'    SEEN.add(f"{b} fwd: perturbed {{[{", ".join(f"{a}.perturbed" for a in args)}]}}")')
                fwd.append(f"    {', '.join(args)} = {', '.join(f'{a}.value' for a in args)}")
            names = any(isinstance(x, Op) and is_name(x) for x, _, _, _ in walk(s.fwd))
            if set(resid) <= set(args) and self.probe == "events" and not names:   # fwd: the primal, args saved
                primal += fwd_body + [f"    return {self.seq(results)}"]
                fwd.append(f"    return {b}({sig}), {res}")
            elif not self.probe and not s.symbolic_zeros:   # the primal: fwd without its residuals
                primal.append(f"    return {b}_fwd({sig})[0]")
                fwd += fwd_body + [f"    return {self.seq(results)}, {res}"]
            else:
                primal += fwd_body + [f"    return {self.seq(results)}"]
                fwd += fwd_body + [f"    return {self.seq(results)}, {res}"]
            bwd_sig = nd + [resid[0] if len(resid) == 1 else "res" if resid else "_",
                            self.seq(cts) if len(cts) == 1 else "cts"]
            bw = [f"def {b}_bwd({', '.join(bwd_sig)}):"] + self.count("    ", b, "bwd")
            if len(resid) > 1:
                bw.append(f"    {self.tuple_(resid)} = res")
            if len(cts) > 1:
                bw.append(f"    {self.tuple_(cts)} = cts")
            bw += bwd + [f"    return {self.tuple_(ret)}"]
            for part in (primal, fwd, bw):
                self.defs.append(fold_returns("\n".join(part)))
            self.defs.append(f"{b}.defvjp({b}_fwd, {b}_bwd{opts})")
        self.last_block = b
        out = [f"{ind}{self.seq(results)} = {b}({', '.join(ndv + args)})"]
        out += [f"{ind}{self.n[r]} = lax.stop_gradient({self.n[r]})" for r in s.non_differentiable]
        return out

    def jvp_block(self, s, path, ind):
        if s.tree != "flat":
            raise ReproError(f"{path}: a custom_jvp taking a pytree has no short form (use --full)")
        b = f"block_{self.next_id()}"
        args, results = [self.n[a] for a in s.args], [self.n[r] for r in s.results]
        tans = [self.n[t] for t in s.tangents]
        body = self.body(s.body, "    ", path + ".body", None)
        src = [f"@jax.custom_jvp   # custom rule {path}", f"def {b}({', '.join(args)}):"]
        src += self.count("    ", b, "primal") + body + [f"    return {self.seq(results)}", "", "",
                                                         f"@{b}.defjvp", f"def {b}_jvp(primals, tangents):"]
        src += self.count("    ", b, "fwd") + [
            f"    {self.tuple_(args)} = primals",
            f"    {self.tuple_(tans)} = tangents",
        ]
        src += body + self.body(s.jvp, "    ", path + ".jvp", None)
        src += [f"    return {self.seq(results)}, {self.seq([self.n[t] for t in s.jvp_results])}", ""]
        self.defs.append("\n".join(src))
        return [f"{ind}{self.seq(results)} = {b}({', '.join(args)})"]

    def function(self, with_outputs: bool = False) -> tuple[str, str]:
        """(definitions, `def f(<differentiated inputs>)` returning the loss: the sum of its
        outputs, auxiliary outputs beside it (`with_outputs`: every output, for a finding on an
        output's value)): the other inputs are globals."""
        lines = self.body(self.prog.body, "    ", "body", None)
        outs = [self.n[o] for o in self.prog.outputs]
        n = len(outs) - self.prog.diff.aux
        loss = " + ".join(f"jnp.sum({o})" for o in outs[:n])
        if with_outputs:
            loss += f", {self.tuple_(outs)}   # the loss, and the outputs"
        elif self.prog.diff.aux:
            loss += f", {self.tuple_(outs[n:])}   # the loss, and auxiliary outputs"
        diff = [self.n[i.id] for i in self.prog.diff_inputs()]
        src = f"def f({', '.join(diff)}):\n" + "\n".join(lines) + f"\n    return {loss}"
        return "\n\n\n".join(d.rstrip() for d in self.defs), fold_returns(src)


def _flags(p: str, finding) -> dict:
    s = settings(p, "jax", finding)
    return {k: bool(s["flags"].get(k, False)) for k in FLAG_NAMES}, s


def _side(flags: dict) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in flags.items()) + "}"


SECOND_ORDER = {   # H @ ones as each mode computes it (the harness's hvp) of the function {f}
    "reverse": "jax.grad(lambda *x: sum(jnp.sum(a) for a in jax.grad({f}, argnums={argn})(*x)), argnums={argn})({d})",
    "fwd_over_rev": "jax.jvp(jax.grad({f}, argnums={argn}), ({d},), tuple(jnp.ones_like(a) for a in ({d},)))[1]",
    "rev_over_fwd": "jax.grad(lambda *x: jax.jvp({f}, x, tuple(jnp.ones_like(a) for a in x))[1], argnums={argn})({d})",
    "linearize": "jax.linearize(jax.grad({f}, argnums={argn}), {d})[1](*(jnp.ones_like(a) for a in ({d},)))",
}


def against_no_checkpoint(finding) -> bool:
    """A JAX pipeline that recomputes what its policies save, judged against the program without checkpoint
    (oracles.residuals.check_policy: every region saves every value)."""
    return (finding.check == "residuals" and finding.reference == "policy"
            and finding.error_type == "recomputed_against_policy" and "no_checkpoint" in finding.detail)


def _sides(finding, pset) -> list[tuple]:
    """(label, pipeline, flags, settings) of the reference (if any) and the finding's pipeline."""
    check, pipe, ref = finding.check, finding.pipeline, finding.reference
    if check == "error":
        others = [p for p in finding.detail.get("status_differs_from") or [] if registry.framework_of(p) == "jax"]
        ref = others[0] if others else ("jax:remat2" if pset["remat"] and pipe != "jax:remat2" else None)
    elif check == "residual_report":   # the report raising (the vjp runs): the rival alone
        got = finding.detail.get("got")
        if not (isinstance(got, dict) and got.get("type")):
            raise ReproError("a residual report that disagrees with the vjp, rather than raises, has no short form "
                             "(use --full)")
        ref = None
    elif against_no_checkpoint(finding):   # a saving policy's region against the program without checkpoint
        ref = finding.detail["no_checkpoint"]
    elif check not in ("residuals", "custom_rule", "trace_count", "gradient", "effect_count"):
        raise ReproError(f"the {check} check has no short form (use --full)")
    elif registry.framework_of(ref) != "jax":
        raise ReproError(f"reference {ref} is not a JAX pipeline (use --full)")
    out = [("REFERENCE", ref, *_flags(ref, finding))] if ref else []
    out += [("RIVAL", pipe, *_flags(pipe, finding))]
    if out[0][3].get("shard_map") and len(out) > 1:
        raise ReproError(f"{ref}: a shard_map reference has no short form (use --full)")
    if out[0][3].get("sharded") and len(out) > 1:
        raise ReproError(f"{ref}: a sharded reference has no short form (use --full)")
    if out[-1][3].get("sharded") and check not in ("error", "gradient"):
        raise ReproError(f"the {check} check of a sharded pipeline has no short form (use --full)")
    if out[-1][3].get("shard_map") and check not in ("error", "gradient"):
        raise ReproError(f"the {check} check of a shard_map pipeline has no short form (use --full)")
    return out


def script(prog, inputs, finding) -> str:
    needs_finding(finding)
    check, pipe = finding.check, finding.pipeline
    if registry.framework_of(pipe) != "jax":
        raise ReproError(f"{pipe} is not a JAX pipeline")
    if prog.diff.cotangents != "ones":
        raise ReproError("seeded-cotangent programs have no short form (use --full)")
    if (prog.diff.batch or any(i.batched for i in prog.inputs)) and (
            check not in ("gradient", "error") or prog.diff.order != 1 or prog.diff.aux
            or any(i.batched and not i.diff for i in prog.inputs)):
        raise ReproError("a per-example program has a short form only for the gradient or error check of first "
                         "order, without auxiliary outputs, every batched input differentiated (use --full)")
    pflags, pset = _flags(pipe, finding)
    sides = _sides(finding, pset)
    prog = dead_code_removed(prog, check)
    has_ck = any(isinstance(s, Checkpoint) for s, _, _, _ in walk(prog.body))
    no_remat = has_ck and not all(s[3]["remat"] for s in sides)
    f64 = pset["f64"]
    if any(s[3]["f64"] != f64 for s in sides):
        raise ReproError("a float64 side beside a same-dtype side has no short form (use --full)")
    probe = {"custom_rule": "events", "trace_count": "counts"}.get(check, "")
    e = ShortJaxEmitter(prog, probe=probe, remat_helper=no_remat, f64=f64)
    with_outputs = check == "gradient" and str(finding.detail.get("value", "")).startswith("output")
    if with_outputs and prog.diff.aux:
        raise ReproError("an output's value with auxiliary outputs has no short form (use --full)")
    defs, fsrc = e.function(with_outputs)
    if check == "error" and any(isinstance(x, CustomVJP) and x.symbolic_zeros and x.optimize_remat
                                for x, _, _, _ in walk(prog.body)):   # defvjp itself may raise: inside f
        moved = re.findall(r"^block_\d+\.defvjp\(.*\)$", defs, re.M)
        defs = re.sub(r"\n*^block_\d+\.defvjp\(.*\)$", "", defs, flags=re.M)
        fsrc = re.sub(r"^(def f\(.*\):\n)", lambda m: m.group(1) + "".join(f"    {x}\n" for x in moved), fsrc)
    diff = [e.n[i.id] for i in prog.diff_inputs()]
    made_per_run = any(fl.get("jax_custom_vjp3") for _, _, fl, _ in sides) and re.search(
        r"jax\.custom_(vjp|gradient)\b", defs)
    if made_per_run:
        defs = _made_per_run(defs)
    body, verdict = _check(finding, prog, sides, ", ".join(diff), len(diff), defs, no_remat, with_outputs)
    if made_per_run:
        body = body.replace(_FLAGS_LINE, "    rules(flags)")
    code_all = defs + fsrc + body + verdict
    imports = []
    for cond, line in ((probe == "counts", "from collections import Counter"),
                       ("partial(" in code_all, "from functools import partial"),
                       ("re.search(" in code_all, "import re"),
                       (re.search(r"\bnp\.", code_all), "import numpy as np"),
                       (True, "import jax"), (True, "import jax.numpy as jnp"),
                       ("lax." in code_all, "from jax import lax")):
        if cond:
            imports.append(line)
    names = [n for n in ("checkpoint_name", "checkpoint_name_fwd", "print_saved_residuals")
             if re.search(rf"\b{n}\(", code_all)]
    if names:
        imports.append(f"from jax.ad_checkpoint import {', '.join(names)}")
    pre = ['jax.config.update("jax_enable_x64", True)   # float64 values'] if (
        f64 or any(i.dtype == "float64" for i in prog.inputs) or "float64" in defs + fsrc) else []
    if "MESH" in body or "place(" in body:   # a shard_map or sharded side: two CPU devices, before JAX starts
        imports.append("from jax.sharding import PartitionSpec as P" if "place(" not in body
                       else "from jax.sharding import NamedSharding, PartitionSpec as P")
        pre += [f'jax.config.update("jax_num_cpu_devices", {registry.SHARD_MAP_DEVICES})',
                f'MESH = jax.make_mesh(({registry.SHARD_MAP_DEVICES},), ("devices",), '
                'axis_types=(jax.sharding.AxisType.Auto,))']
    if "place(" in body:
        pre += ["", "", "def place(a):   # the leading axis split over the devices where it divides evenly, else "
                "replicated",
                "    split = a.ndim and a.shape[0] % MESH.devices.size == 0",
                '    return jax.device_put(a, NamedSharding(MESH, P("devices") if split else P()))']
    if code_all.count("cp.") > 1:
        pre.append("cp = jax.checkpoint_policies")
    else:
        defs, fsrc = (x.replace("cp.", "jax.checkpoint_policies.") for x in (defs, fsrc))
    if probe:
        pre.append({"events": "SEEN = set()   # what the custom rules saw",
                    "counts": "SEEN = Counter()   # how often each custom rule ran"}[probe])
    if no_remat:
        pre += ["", "", "def checkpoint(fn, **kw):   # REMAT False: the no-checkpoint reference",
                "    return jax.checkpoint(fn, **kw) if REMAT else fn"]
    ins = [f"{e.n[i.id]} = jnp.array({array_text(inputs[i.id], i.dtype)}, jnp.{'float64' if f64 else i.dtype})"
           + ("" if i.diff else "   # not differentiated") for i in prog.inputs if e.n[i.id] in code_all]
    sentence = error_sentence(finding, sides[0][1] if len(sides) > 1 else None) if check == "error" else \
        _SENTENCE["residuals:policy" if against_no_checkpoint(finding) else check].format(P=pipe, R=sides[0][1])
    parts = [header(finding, sentence), "\n".join(imports), "\n".join(pre),
             _state_helper(_effect_helper(used_helpers(jax_table.PRELUDE, code_all), prog), prog), "\n".join(ins), defs,
             fsrc, body, verdict]
    return "\n\n\n".join(x.strip("\n") for x in parts if x.strip()) + "\n"


# The prelude's effect helper where the program has debug callbacks only (no io_callback): the same counting
CALLBACK_EFFECT = ('def effect(x, kind):   # x, with a jax.debug.callback that counts its runs in EFFECT_RUNS[kind]\n'
                   '    jax.debug.callback(lambda *_: EFFECT_RUNS.update({kind: EFFECT_RUNS.get(kind, 0) + 1}), x,\n'
                   '                       ordered=kind == "ordered")\n'
                   '    return x\n')


def _effect_helper(helpers: str, prog) -> str:
    """The helpers with the effect helper cut to its debug-callback form where no io_callback is used."""
    if any(isinstance(s, Op) and s.op == "effect" and s.params["kind"] in IO_EFFECTS for s, _, _, _ in walk(prog.body)):
        return helpers
    return _swap_helper(helpers, "effect(x, kind)", "return x", CALLBACK_EFFECT.rstrip("\n"))


# The prelude's with_state where every stateful region of the program does the same (read, write or +=)
_STATE_STEP = {"read": ["first = first + ref[...].astype(first.dtype)"],
               "write": ["ref[...] = jnp.sum(first).astype(ref.dtype)", "first = first * ref[...].astype(first.dtype)"],
               "accumulate": ["ref[...] += jnp.sum(first).astype(ref.dtype)",
                              "first = first * ref[...].astype(first.dtype)"]}


def _state_helper(helpers: str, prog) -> str:
    """The helpers with with_state cut to the one state kind the program's regions use."""
    kinds = {s.state for s, _, _, _ in walk(prog.body) if isinstance(s, Checkpoint) and s.state != "none"}
    if len(kinds) != 1:
        return helpers
    kind = kinds.pop()
    short = "\n".join([f"def with_state(kind, ref):   # the region's function, then its mutable state ({kind})",
                       "    def wrap(fn):", "        def stateful(*args):", "            first, *rest = fn(*args)",
                       *[f"            {line}" for line in _STATE_STEP[kind]],
                       "            return (first, *rest)", "        return stateful", "    return wrap"])
    return _swap_helper(helpers, "with_state(kind, ref)", "return wrap", short)


def _swap_helper(helpers: str, signature: str, last: str, short: str) -> str:
    """The helpers with the prelude function `def {signature}:` (up to its top-level `{last}`) replaced by `short`."""
    whole = rf"def {re.escape(signature)}:\n(?:(?:    .*)?\n)*?    {re.escape(last)}$"
    return re.sub(whole, lambda _: short, helpers, flags=re.M)


_SENTENCE = {
    "residuals": "{P} and {R} claim the same checkpoint policies but save different residuals "
                 "(compare the lists printed by print_saved_residuals).",
    "residuals:policy": "Every checkpoint region's policy saves every value, yet {P} saves less than the same "
                        "program without checkpoint ({R}): it recomputes what its policy saves.",
    "custom_rule": "The custom rules see different things under {P} than under {R}: whether fwd ran, its "
                   "perturbed flags, the symbolic-zero cotangents bwd gets.",
    "effect_count": "The effects (jax.debug.callback, io_callback) run a different number of times under {P} "
                    "than under {R} (counted per kind in EFFECT_RUNS over one jax.grad).",
    "trace_count": "The custom rules are traced or called more often under {P} than under {R} (total traces "
                   "of each rule, and bwd calls).",
    "error": "{P}: see the error printed below.",
    "gradient": "{P} computes gradients that differ from {R} beyond the tolerance.",
    "residual_report": "JAX's residual report (print_saved_residuals) raises under {P}, where jax.vjp of the same "
                       "function runs.",
}


_FLAGS_LINE = "    for k, v in flags.items(): (v or hasattr(jax.config, k)) and jax.config.update(k, v)"


def _made_per_run(defs: str) -> str:
    """The definitions inside `rules(flags)`, which sets each run's flags and then makes them: jax before 0.12
    reads jax_custom_vjp3 where jax.custom_vjp (or jax.custom_gradient) is applied, not where the rule is called,
    so rules made once, flags off, would test the old custom_vjp on every side of those releases."""
    names = list(dict.fromkeys(re.findall(r"^def (\w+)\(", defs, re.M)))
    head = ["def rules(flags):   # the rules made under each run's flags (jax before 0.12 reads jax_custom_vjp3 "
            "where custom_vjp is applied)", f"    global {', '.join(names)}", _FLAGS_LINE]
    lines = re.sub(r"\n{3,}", "\n\n", defs).split("\n")
    return "\n".join(head + [f"    {line}" if line.strip() else "" for line in lines])


def _run_head(name, remat=False, sharded=False, placed=""):
    """The run function's head; `placed`: the differentiated inputs, placed with a NamedSharding where the call says
    so (a sharded side) as `args`."""
    out = [f"def {name}(flags{', remat' if remat else ''}{', sharded=False' if sharded else ''}"
           f"{', placed=False' if placed else ''}):"]
    if remat:
        out += ["    global REMAT", "    REMAT = remat"]
    # one line: the flags are not the program (a release without a flag runs as if it were off)
    out += [_FLAGS_LINE]
    if sharded:   # the program inside shard_map over the CPU devices, everything replicated
        out.append("    fn = jax.shard_map(f, mesh=MESH, in_specs=P(), out_specs=P()) if sharded else f")
    if placed:
        out.append(f"    args = [place(a) if placed else a for a in ({placed},)]")
    return out


def _calls(fn, sides, no_remat, first="rival"):
    """`rival = fn({flags})   # pipeline` and the reference's (with each side's remat where it matters)."""
    lines = {}
    for lab, p, fl, st in sides:
        name = "rival" if lab == "RIVAL" else "reference"
        sm = ", sharded=True" if st.get("shard_map") else ", placed=True" if st.get("sharded") else ""
        lines[name] = f"{name} = {fn}({_side(fl)}{', remat=' + str(st['remat']) if no_remat else ''}{sm})   # {p}"
    order = ["rival", "reference"] if first == "rival" else ["reference", "rival"]
    return "\n".join(lines[n] for n in order if n in lines)


def _check(finding, prog, sides, d, n, defs, no_remat, with_outputs=False):
    """(the run function and its calls, the verdict)."""
    check = finding.check
    jit = sides[-1][3]["jit"]
    sharded = bool(sides[-1][3].get("shard_map"))
    placed = d if sides[-1][3].get("sharded") else ""   # (a sharded rival: its inputs placed, as `args`)
    fname = "fn" if sharded else "f"
    argn = tuple(range(n))
    grad = (f"jax.grad({fname}" + (f", argnums={argn!r}" if n > 1 else "")
            + (", has_aux=True)" if prog.diff.aux or with_outputs else ")"))
    if prog.diff.batch:   # per example: the gradient of each example's loss (shared inputs broadcast)
        diff_inputs = [i for i in prog.inputs if i.diff]
        grad = f"jax.vmap({grad}, in_axes={tuple(0 if i.batched else None for i in diff_inputs)!r})"
    d_call = "*args" if placed else d
    call = f"jax.jit({grad})({d_call})" if jit else f"{grad}({d_call})"
    gcall = f"{'jax.jit(g)' if jit else 'g'}({d_call})" + ("[0]" if prog.diff.aux else "")
    order2 = [f"    g = {grad}", f"    out = [*{gcall}]" if n > 1 else f"    out = [{gcall}]"]
    if with_outputs:   # the gradients, then the outputs (the value the finding is about)
        gs = "*gs" if n > 1 else "gs"
        order2 = [f"    g = {grad}", f"    gs, outs = {gcall}", f"    out = [{gs}, *outs]"]
    if prog.diff.aux and prog.diff.order == 2:
        raise ReproError("second order with auxiliary outputs has no short form (use --full)")
    if prog.diff.order == 2:
        h = SECOND_ORDER[prog.diff.mode].format(d=d, argn=argn, f=fname)
        order2.append(f"    out += jax.jit(lambda {d}: {h})({d})" if jit else f"    out += {h}")
    # what a rule sees and how often it runs is judged on the whole differentiation (second order too)
    ran = [f"    {call}"] if prog.diff.order == 1 else order2
    if check == "custom_rule":
        body = _run_head("seen") + ["    SEEN.clear()", *ran, "    print(flags, sorted(SEEN))",
                                    "    return SEEN.copy()", "", "", _calls("seen", sides, False)]
        return "\n".join(body), _verdict("rival != reference", "the custom rules saw different things",
                                         "the custom rules saw the same")
    if check == "trace_count":
        rules = list(dict.fromkeys(re.findall(r'SEEN\["(\w+) ', defs)))
        body = _run_head("runs") + ["    jax.clear_caches()", "    SEEN.clear()", *ran,
                                    "    print(flags, dict(SEEN))", "    return SEEN.copy()", "", "",
                                    _calls("runs", sides, False),
                                    "traces = lambda c, r: c[r + ' primal'] + c[r + ' fwd']   # moved is not more",
                                    f"grew = [r for r in {rules!r} if 0 < traces(reference, r) < traces(rival, r) "
                                    "or 0 < reference[r + ' bwd'] < rival[r + ' bwd']]"]
        return "\n".join(body), _verdict("grew", "rules run more often: {grew}", "no rule runs more often")
    if check == "effect_count":   # how often each effect kind's callbacks ran (forward and backward)
        body = _run_head("runs", no_remat) + ["    jax.clear_caches()", "    EFFECT_RUNS.clear()", f"    {call}",
                                              "    jax.effects_barrier()", "    print(flags, EFFECT_RUNS)",
                                              "    return dict(EFFECT_RUNS)", "", "", _calls("runs", sides, no_remat)]
        if registry.role_of(finding.reference) == registry.BASELINE:   # without checkpoint: fewer runs only
            body.append("fewer = [k for k, n in reference.items() if rival.get(k, 0) < n]")
            return "\n".join(body), _verdict("fewer", "effects run fewer times than without checkpoint: {fewer}",
                                              "no effect runs fewer times")
        return "\n".join(body), _verdict("rival != reference", "effects run a different number of times",
                                          "each effect runs as often")
    aux = ", has_aux=True" if prog.diff.aux else ""   # auxiliary outputs are not differentiated
    loss = f"lambda {d}: f({d})[0]" if prog.diff.aux else "f"   # (what print_saved_residuals differentiates)
    if check == "residuals":
        vjp = f"jax.jit(lambda {d}: jax.vjp(f, {d}{aux})[1])({d})" if jit else f"jax.vjp(f, {d}{aux})[1]"
        body = _run_head("saved", no_remat) + [
            "    print(flags)", f"    try: print_saved_residuals({loss}, {d})",
            "    except ValueError as e: print('print_saved_residuals raised', str(e)[:200])   # (a Ref among them)",
            f"    leaves = [x[...] if isinstance(x, getattr(jax, 'Ref', ())) else x for x in jax.tree.leaves({vjp})]",
            "    return sorted((str(x.aval), np.round(np.asarray(x, float), 5).tolist()) for x in leaves)",
            "", "", _calls("saved", sides, no_remat, "reference"), 'print("held:", rival, "vs", reference)']
        if against_no_checkpoint(finding):   # what the program saves without checkpoint that the rival does not
            body += ["missing = [a for a, _ in reference]", "for a, _ in rival: a in missing and missing.remove(a)"]
            return "\n".join(body), _verdict("missing", "recomputes what its policy saves: {missing}",
                                              "saves what the program saves without checkpoint")
        return "\n".join(body), _verdict("rival != reference", "different residuals", "the same residuals")
    if check == "residual_report":   # JAX's own report (print_saved_residuals) raising where the vjp runs
        body = _run_head("report") + [
            "    print(flags)", "    try:", f"        print_saved_residuals({loss}, {d})", "    except Exception as e:",
            "        print('print_saved_residuals raised', f'{type(e).__name__}: {e}'[:500])", "        return e",
            f"    print('the vjp holds', len(jax.tree.leaves(jax.vjp(f, {d}{aux})[1])), 'residuals')",
            "", "", _calls("report", sides, False)]
        et = finding.error_type
        return "\n".join(body), _verdict(f"type(rival).__name__ == {et!r}", f"JAX's residual report raises {et}",
                                         f"the report does not raise {et}")
    if check == "error":
        exp = finding.detail.get("expected") if isinstance(finding.detail.get("expected"), dict) else None
        tried = [f"    {call}"] if prog.diff.order == 1 else order2
        body = _run_head("attempt", no_remat, sharded, placed) + ["    try:"] + ["    " + x for x in tried] + [
            "    except Exception as e:", "        print(flags, 'raised', f'{type(e).__name__}: {e}'[:500])",
            "        return e", "    print(flags, 'raised nothing')", "", "",
            _calls("attempt", sides, no_remat, "reference")]
        if exp:
            typ = "" if exp.get("type", ".*") == ".*" else f"re.search({exp['type']!r}, type(rival).__name__) and "
            cond = f"not (rival and {typ}re.search({exp.get('regex', '')!r}, str(rival)))"
            return "\n".join(body), _verdict(cond, "expected to raise an error matching "
                                              f"{exp.get('regex', '')!r}, but did not", "it raises the expected error")
        et = finding.error_type
        return "\n".join(body), _verdict(
            f"type(rival).__name__ == {et!r}", f"it raises {et}", f"it does not raise {et}"
        )
    if check == "gradient":
        mode = "tight" if registry.role_of(finding.reference) == registry.BASELINE else "loose"
        rtol, atol = tolerance(prog, mode)
        body = (
            _run_head("grads", no_remat, sharded, placed)
            + order2
            + [
                "    print(flags, [np.asarray(a) for a in out])",
                "    return out",
                "",
                "",
                _calls("grads", sides, no_remat),
                f"RTOL, ATOL = {rtol:.3g}, {atol:.3g}   "
                f"# the harness's tolerance for {finding.pipeline} vs {finding.reference}",
                "bad = [k for k, (a, b) in enumerate(zip(rival, reference))",
                "       if not np.allclose(a, b, rtol=RTOL, atol=ATOL * max(1.0, np.abs(b).max()))]",
            ]
        )
        what = "values {bad} (the gradients, then the outputs)" if with_outputs else "gradients {bad}"
        return "\n".join(body), _verdict("bad", what + " differ beyond the tolerance", "the values agree")
    raise ReproError(f"the {check} check has no short form (use --full)")


def _verdict(cond, yes, no):
    """One line: exit 1 with the message (sys.exit's string) while it reproduces, else 0."""
    return f'raise SystemExit(f"REPRODUCES: {yes}" if {cond} else 0)   # 0: fixed ({no})'

