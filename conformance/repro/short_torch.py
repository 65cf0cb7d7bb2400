"""The short PyTorch repro: the program as plain PyTorch (torch.utils.checkpoint with a SAC
policy_fn written out for the region's policy, custom rules as torch.autograd.Function,
torch.compile for compiled pipelines), the exact inputs, the pipeline and its reference side by
side with a saved_tensors_hooks listing, a print in the rule, the exception or both gradients,
and the verdict."""
from __future__ import annotations

from conformance.ir.nodes import Checkpoint, walk
from conformance.ir.ops import NAME_OP
from conformance.ir.policy import NoPolicy, decide, thresholds
from conformance.pipelines import registry
from conformance.pipelines.torch import table as torch_table
from conformance.repro.emit import Emitter
from conformance.repro.emit_torch import TorchEmitter
from conformance.repro.plan import ReproError, settings
from conformance.repro.short_common import (
    ShortDialect,
    array_text,
    dead_code_removed,
    error_sentence,
    fold_returns,
    header,
    used_helpers,
)
from oracles.gradients import tolerance

TAG = '''@torch.library.custom_op("rc::tag", mutates_args=())
def tag(x: torch.Tensor, name: str) -> torch.Tensor:   # checkpoint_name: an identity op carrying a name
    NAMED[name] = x.detach().clone()
    return x.clone()


tag.register_fake(lambda x, name: torch.empty_like(x))
tag.register_autograd(lambda ctx, g: (g, None), setup_context=lambda ctx, inputs, output: None)'''


# as the harness differentiates: an input the loss does not read gets a zero gradient, not an error
AS_HARNESS = ", allow_unused=True, materialize_grads=True"


def _packets() -> dict[str, list[tuple[str, bool]]]:
    return torch_table.kinds_of()


def policy_fn(policy, names: list[str], fn: str, prefer: bool) -> str:
    """A SAC policy_fn for one region's policy, decided by the one policy meaning."""
    if thresholds(policy):
        raise ReproError("a policy deciding on element counts has no short form (use --full)")
    pol = "CheckpointPolicy.PREFER_" if prefer else "CheckpointPolicy.MUST_"
    default = decide(policy, None, None, False, None)
    ds = {pk: {decide(policy, op, None, b, None) for op, b in kinds} for pk, kinds in _packets().items()}
    ds = {pk: "save" if "save" in d else "offload" if "offload" in d else "recompute" for pk, d in ds.items()}
    named = {n: decide(policy, NAME_OP, n, False, None) for n in names}
    word = {"save": "SAVE", "recompute": "RECOMPUTE", "offload": "CPU_OFFLOAD"}
    def others(decisions):   # each decision other than the default, and what takes it
        out: dict[str, list[str]] = {}
        for k, d in sorted(decisions.items()):
            if d != default:
                out.setdefault(d, []).append(k)
        return out

    def returns(ind, test, groups):   # `return X if test else default`, or one `if` per decision
        if len(groups) == 1:
            [(d, ks)] = groups.items()
            return [f"{ind}return {pol}{word[d]} if {test(ks)} else {pol}{word[default]}"]
        return [f"{ind}if {test(ks)}:\n{ind}    return {pol}{word[d]}" for d, ks in groups.items()] + [
            f"{ind}return {pol}{word[default]}"]
    lines = [f"def {fn}(ctx, op, *args, **kwargs):   # {policy.kind}"]
    by_name = others(named)
    if by_name:
        lines.append("    if op.overloadpacket is torch.ops.rc.tag:")
        lines += returns("        ", lambda ns: f"args[1] in {tuple(ns)!r}", by_name)
    lines += returns("    ", lambda pks: f"op.overloadpacket in ({', '.join(pks)},)", others(ds))
    return "\n".join(lines)


class ShortTorchEmitter(ShortDialect, TorchEmitter):
    MODULE, ZEROS_DTYPE = "torch", "dtype={}"

    def __init__(self, prog, probe="", remat_helper=False, prefer=False, hooks=False, compile_inside=None, f64=False,
                 reentrant=False):
        super().__init__(prog)
        self.reentrant = reentrant   # use_reentrant=True (no policy: reentrant checkpoint has no selective form)
        # hooks: respect_saved_tensors_hooks=True on selective regions (or "False": SAC's cache bypasses them)
        self.probe, self.remat_helper, self.prefer, self.hooks = probe, remat_helper, prefer, hooks
        self.compile_inside, self.f64 = compile_inside, f64

    def scan_loop(self, k, step, s, ind, init, xs, carry_res, ys_res):
        """A vmap-spelled loop as the Python loop (a short form's pipeline never sets func_vmap: see _SIMPLE)."""
        return Emitter.scan_loop(self, k, step, s, ind, init, xs, carry_res, ys_res)

    def region(self, s, path, ind, nd):
        if s.tree != "flat" or s.static_flag or s.extras:
            raise ReproError(f"{path}: a region taking a pytree or a static flag, or returning non-tensor values, "
                             "has no short form (use --full)")
        k = self.next_id()
        fn = f"region_{k}"
        args, res = [self.n[a] for a in s.args], [self.n[r] for r in s.results]
        src = [f"def {fn}({', '.join(args)}):   # checkpoint region {path}"]
        src += self.body(s.body, "    ", path + ".body", nd) + [f"    return {self.seq(res)}"]
        self.defs.append(fold_returns("\n".join(src)))
        kw = f", use_reentrant={self.reentrant}"
        if not isinstance(s.policy, NoPolicy) and not self.reentrant:
            self.defs.append(policy_fn(s.policy, self.names, f"policy_{k}", self.prefer))
            kw += f", context_fn=partial(create_selective_checkpoint_contexts, policy_{k})"
            if self.hooks:
                kw += f", respect_saved_tensors_hooks={self.hooks == 'respect'}"
        target = f"torch.compile({fn}, backend={self.compile_inside!r})" if self.compile_inside else fn
        return [f"{ind}{self.seq(res)} = checkpoint({target}, {', '.join(args)}{kw})   # {path}"]

    def block(self, s, path, ind):
        if s.tree != "flat" or s.perturbed_branch or s.residual_tree != "tuple" or s.nondiff:
            raise ReproError(f"{path}: this custom rule's spelling has no short form (use --full)")
        cls = f"Block{self.next_id()}"
        _, args, results, resid, cts, _ = self.block_names(s)
        ret = [self.n[r] if r else "None" for r, a in zip(s.bwd_results, s.args)]
        src = [f"class {cls}(torch.autograd.Function):   # custom rule {path}", "    @staticmethod",
               f"    def forward(ctx, {', '.join(args)}):"]
        if s.symbolic_zeros:
            src.append("        ctx.set_materialize_grads(False)   # zero cotangents as None")
        src += self.body(s.fwd, "        ", path + ".fwd", None)
        if resid:
            src.append(f"        ctx.save_for_backward({', '.join(resid)})")
        if s.non_differentiable:
            src.append(f"        ctx.mark_non_differentiable({', '.join(self.n[r] for r in s.non_differentiable)})")
        src += [f"        return {', '.join(results)}", "", "    @staticmethod"]
        if s.once_differentiable:
            src.append("    @torch.autograd.function.once_differentiable")
        src.append(f"    def backward(ctx, {', '.join(cts)}):")
        if self.probe == "events":
            kinds = ", ".join(f"None if {c} is None else bool({c}.any())" for c in cts)
            src.append(f'        SEEN.add(f"{cls}.backward: cotangent nonzero {{[{kinds}]}}")')
        if resid:
            src.append(f"        {self.seq(resid)}, = ctx.saved_tensors" if len(resid) == 1 else
                       f"        {', '.join(resid)} = ctx.saved_tensors")
        if s.symbolic_zeros:
            src += [f"        {c} = {self.zeros(r)} if {c} is None else {c}" for c, r in zip(cts, s.results)]
        src += self.body(s.bwd, "        ", path + ".bwd", None)
        if s.bwd_branch:
            src += [f"        if bool(torch.sum({cts[0]}) < 0):", f"            {ret[0]} = {ret[0]} * 2"]
        src.append(f"        return {', '.join(ret)}")
        self.defs.append(fold_returns("\n".join(src)))
        return [f"{ind}{', '.join(results)} = {cls}.apply({', '.join(args)})"]

    def jvp_block(self, s, path, ind):
        raise ReproError("PyTorch has no custom_jvp")

    def function(self):
        lines = self.body(self.prog.body, "    ", "body", None)
        outs = [self.n[o] for o in self.prog.outputs]
        n = len(outs) - self.prog.diff.aux
        diff = [self.n[i.id] for i in self.prog.diff_inputs()]
        src = f"def f({', '.join(diff)}):\n" + "\n".join(lines) + "\n    return " + " + ".join(
            f"torch.sum({o})" for o in outs[:n])
        return "\n\n\n".join(d.rstrip() for d in self.defs), fold_returns(src)


_SIMPLE = ("checks_off", "backward_twice", "dynamic", "graph_break", "sequential", "functional_call",
           "func_vmap", "allow_mutation")
# Options the short form writes (the rival's, `option=True` in its run): the forward under a context (saved-tensor
# hooks, early stop off), or the program exported and its module run.
# (user hooks: the prelude's user_hooks, pasted as the helpers the script calls are)
_CONTEXTS = {"save_on_cpu": "torch.autograd.graph.save_on_cpu()",
             "user": "torch.autograd.graph.saved_tensors_hooks(*user_hooks())",
             "user_bypassed": "torch.autograd.graph.saved_tensors_hooks(*user_hooks())",
             "disabled": 'torch.autograd.graph.disable_saved_tensors_hooks("saved-tensor hooks are disabled")'}


def _option(st: dict) -> tuple[str, str] | None:
    """The one short-form option a side runs with (hooks, early_stop_off, export), if any."""
    on = [(k, st[k]) for k in ("hooks", "early_stop_off", "export") if st.get(k)]
    if len(on) > 1:
        raise ReproError(f"options {on} together have no short form (use --full)")
    return on[0] if on else None


# A side's partitioner: min-cut is torch.compile's own (the backend by name); AOTAutograd's default one, the backend
# function the short form defines (DEFAULT_PARTITION)
PARTITIONED = {"min_cut": None, "default": "aot_eager_default_partition"}
DEFAULT_PARTITION = [
    "def aot_eager_default_partition(gm, example_inputs):   # aot_eager with AOTAutograd's default partitioner",
    "    return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g),",
    "                                 bw_compiler=lambda g, _: make_boxed_func(g),",
    "                                 partition_fn=partitioners.default_partition)"]


def _backend_fn(st: dict) -> str | None:
    """The backend function a side's script defines (AOTAutograd's default partitioner), else None."""
    return PARTITIONED[st["partitioner"]] if st["backend"] == "aot_eager" else None


def _side_args(st: dict, vary: set) -> str:
    parts = []
    if "backend" in vary:
        parts.append(f"backend={_backend_fn(st) or repr(st['backend'])}")
    if "memory_budget" in vary:
        parts.append(f"budget={st['memory_budget']!r}")
    if "f64" in vary:
        parts.append(f"dtype=torch.{'float64' if st['f64'] else 'float32'}")
    if "remat" in vary:
        parts.append(f"remat={st['remat']}")
    return ", ".join(parts)


def script(prog, inputs, finding) -> str:
    check, pipe, ref = finding.check, finding.pipeline, finding.reference
    if prog.diff.batch or prog.diff.cotangents != "ones" or prog.diff.aux:
        raise ReproError("per-example, seeded-cotangent or auxiliary-output programs have no short form (use --full)")
    # a value the policy asks SAC to save that it recomputes: the backward's op counts with and without checkpoint
    recount = check == "residuals" and ref == "policy" and finding.error_type == "recomputed_against_policy"
    if check == "error":
        others = [p for p in finding.detail.get("status_differs_from") or [] if registry.framework_of(p) == "torch"]
        ref = others[-1] if others else None
    elif recount:   # (compiled: the partitioner's own backward graph is read, no reference run)
        ref = None if settings(pipe, "torch", finding)["backend"] else registry.baseline_of(pipe) or "torch:none"
    elif check not in ("residuals", "custom_rule", "gradient") or not registry.runs_in(ref, "torch"):
        raise ReproError(f"the {check} check against {ref} has no short form (use --full)")
    sides = [(p, settings(p, "torch", finding)) for p in ([ref] if ref else []) + [pipe]]
    for p, st in sides:
        if any(st.get(k) for k in _SIMPLE) or st.get("policy_state") or st["partitioner"] not in PARTITIONED:
            raise ReproError(f"{p}: its checkpoint options have no short form (use --full)")
    rival = sides[-1][1]
    reentrant = rival["reentrant"]
    if reentrant and (check not in ("gradient", "error") or any(
            st["remat"] and not st["reentrant"] for _, st in sides)):
        raise ReproError(f"{pipe}: reentrant checkpoint beside a non-reentrant one, or its {check} check, has no "
                         "short form (use --full)")
    if len(sides) > 1 and _option(sides[0][1]):
        raise ReproError(f"{sides[0][0]}: a reference with checkpoint options has no short form (use --full)")
    option = _option(rival)
    if option and check in ("residuals", "custom_rule"):
        raise ReproError(f"the {check} check of {pipe} has no short form (use --full)")
    prog = dead_code_removed(prog, check)
    has_ck = any(isinstance(s, Checkpoint) for s, _, _, _ in walk(prog.body))
    vary = {k for k in ("backend", "memory_budget", "f64", "remat") if len({str(st[k]) for _, st in sides}) > 1
            or (k == "backend" and rival["backend"] and not rival["compile_inside"])}
    if not has_ck:
        vary.discard("remat")
    if rival["compile_inside"]:
        vary.discard("backend")
    probe = "events" if check == "custom_rule" else ""
    e = ShortTorchEmitter(
        prog,
        probe=probe,
        remat_helper="remat" in vary,
        prefer=rival["prefer"],
        hooks=("respect" if (check == "residuals" and not recount) or (option and option[1] in ("save_on_cpu", "user"))
               else "bypass" if option and option[1] == "user_bypassed" else ""),
        compile_inside=rival["backend"] if rival["compile_inside"] else None,
        reentrant=reentrant,
    )
    defs, fsrc = e.function()
    names = torch_table.program_names(prog)
    diff = [e.n[i.id] for i in prog.diff_inputs()]
    d = ", ".join(diff)
    params = ", ".join(x.split("=")[0] + "=" + {"backend": "None", "budget": "1.0", "dtype": "torch.float32",
                                                  "remat": "True"}[x.split("=")[0]]
                       for x in _side_args(rival, vary).split(", ") if x)
    if option:
        params = ", ".join([x for x in [params, "option=False"] if x])
    head = [f"def run({params}):"]
    if "remat" in vary:
        head += ["    global REMAT", "    REMAT = remat"]
    if rival["backend"]:
        head.append("    torch._dynamo.reset()")
    if "memory_budget" in vary:
        head.append("    torch._functorch.config.activation_memory_budget = budget")
    if "random" in prog.features():   # the generator seeded as the harness seeds it
        head.append("    torch.manual_seed(0)")
    xs = f"[x.to({'dtype' if 'f64' in vary else 'torch.float32'}).requires_grad_() for x in ({d},)]" \
        if "f64" in vary else f"[{d}]"
    fn = "torch.compile(f, backend=backend) if backend else f" if "backend" in vary else "f"
    head += [f"    xs = {xs}"] if "f64" in vary else []
    args = "*xs" if "f64" in vary else d
    xs_name = "xs" if "f64" in vary else f"[{d}]"
    grad_line = f"torch.autograd.grad(({fn})({args}), {xs_name}{AS_HARNESS})" if "backend" in vary else \
        f"torch.autograd.grad(f({args}), {xs_name}{AS_HARNESS})"
    if "backend" in vary:
        head.append(f"    fn = {fn}")
        grad_line = f"torch.autograd.grad(fn({args}), {xs_name}{AS_HARNESS})"
    pre = []
    if any(_backend_fn(st) for _, st in sides):
        pre += ["", ""] + DEFAULT_PARTITION
    forward = f"{'fn' if 'backend' in vary else 'f'}({args})"   # the forward: its loss
    if option:
        def call(p, st):
            side = [x for x in [_side_args(st, vary), "option=True" if _option(st) else ""] if x]
            return f"run({', '.join(side)})   # {p}"
        if option[0] == "export":
            pre += ["", "", "class Module(torch.nn.Module):   # the program as a module, for torch.export",
                    "    def forward(self, *xs):", "        return f(*xs)"]
            forward = (f"(torch.export.export(Module(), ({d},), strict={option[1] == 'strict'}).module() "
                       f"if option else f)({args})")
        else:
            ctx = (_CONTEXTS[option[1]] if option[0] == "hooks"
                   else "torch.utils.checkpoint.set_checkpoint_early_stop(False)")
            head += [f"    with ({ctx} if option else torch.enable_grad()):", f"        loss = {forward}"]
            forward = "loss"
        grad_line = f"torch.autograd.grad({forward}, {xs_name}{AS_HARNESS})"
    else:
        def call(p, st):
            return f"run({_side_args(st, vary)})   # {p}"
    if reentrant:   # reentrant checkpoint rejects torch.autograd.grad: .backward(), then each input's .grad
        grad_line = grad_line.replace(AS_HARNESS, "").replace("torch.autograd.grad(", "grads(")
        pre += ["", "", "def grads(loss, xs):   # reentrant checkpoint rejects torch.autograd.grad",
                "    for x in xs:", "        x.grad = None", "    if loss.requires_grad:", "        loss.backward()",
                "    return [torch.zeros_like(x) if x.grad is None else x.grad for x in xs]"]
    if recount and rival["backend"]:
        if rival["compile_inside"]:
            raise ReproError(f"{pipe}: a partitioner's recompute in regions compiled one by one has no short form "
                             "(use --full)")
        pre += ["", "", "RECOMPUTED = []   # nodes the policy marks MUST_SAVE that the backward graph computes again",
                "", "", "def partition(joint, inputs, **kw):   # torch.compile's min-cut partitioner, read",
                "    asked = {n.name for n in joint.graph.nodes if 'ac_graph_id' in n.meta",
                "             and n.meta.get('recompute') == CheckpointPolicy.MUST_SAVE",
                "             and isinstance(n.meta.get('val'), torch.Tensor)}",
                "    fw, bw = partitioners.min_cut_rematerialization_partition(joint, inputs, **kw)",
                "    RECOMPUTED.extend(f'{n.name} ({n.target})' for n in bw.graph.nodes",
                "                      if n.op == 'call_function' and n.name in asked)",
                "    return fw, bw", "", "",
                "def partitioned(gm, example_inputs):   # aot_eager, with the partitioner above",
                "    return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g),",
                "                                 bw_compiler=lambda g, _: make_boxed_func(g), partition_fn=partition)"]
        body = head + ["    RECOMPUTED.clear()", f"    torch.autograd.grad({forward}, {xs_name}, allow_unused=True)",
                       "    print('  MUST_SAVE nodes the backward graph computes again:', RECOMPUTED)",
                       "    return list(RECOMPUTED)", "", "", f"rival = run(backend=partitioned)   # {pipe}"]
        verdict = ('raise SystemExit(f"REPRODUCES: the backward graph recomputes {rival}, which the policy marks '
                   'MUST_SAVE" if rival else 0)   # 0: fixed')
    elif recount:
        pre += ["", "", "class CountOps(TorchDispatchMode):   # the aten ops run while it is active, by op",
                "    def __init__(self):", "        super().__init__()", "        self.n = Counter()", "",
                "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):",
                "        self.n[str(func.overloadpacket)] += 1", "        return func(*args, **(kwargs or {}))"]
        body = head + [f"    loss = {forward}", "    with CountOps() as ops:   # the backward, recompute included",
                       f"        torch.autograd.grad(loss, {xs_name}, allow_unused=True)",
                       "    print('  ops the backward ran:', dict(sorted(ops.n.items())))", "    return ops.n", "", "",
                       f"reference = {call(*sides[0])}", f"rival = {call(*sides[1])}",
                       f"ASKED = {sorted(finding.detail.get('aten_ops') or [])!r}   # ops its policy marks to save, "
                       "which SAC's cache held as to recompute",
                       "extra = {op: rival[op] - reference[op] for op in ASKED if rival[op] > reference[op]}"]
        verdict = ('raise SystemExit(f"REPRODUCES: the backward recomputes {extra}, which the policy marks to save" '
                   'if extra else 0)   # 0: fixed')
    elif check == "residuals":
        pre.append("SAVED = []   # what the forward saves for backward (saved_tensors_hooks)")
        body = head + [
            "    SAVED.clear()",
            "    with torch.autograd.graph.saved_tensors_hooks(lambda t: SAVED.append(t) or t, lambda t: t):",
            f"        loss = {'fn' if 'backend' in vary else 'f'}({args})",
            f"    torch.autograd.grad(loss, {xs_name}{AS_HARNESS})",
        ]
        if names:
            body += [
                "    held = sorted(n for n, v in NAMED.items()"
                " if any(t.shape == v.shape and torch.equal(t, v) for t in SAVED))",
                "    print(f'  saves {[(tuple(t.shape), t.dtype) for t in SAVED]}; named values among them: {held}')",
                "    return held",
            ]
            what = "the named values saved differ"
        else:
            body += [
                "    held = sum(t.nbytes for t in SAVED)",
                "    print(f'  saves {[(tuple(t.shape), t.dtype) for t in SAVED]}: {held} bytes')",
                "    return held",
            ]
            what = "more bytes saved" if finding.error_type == "saved_bytes_grew" else "different residuals"
        cond = "rival > reference" if finding.error_type == "saved_bytes_grew" else "rival != reference"
        body += ["", "", f"reference = {call(*sides[0])}", f"rival = {call(*sides[1])}"]
        verdict = f'raise SystemExit("REPRODUCES: {what}" if {cond} else 0)   # 0: fixed'
    elif check == "custom_rule":
        pre.append("SEEN = set()   # what the custom rules saw")
        body = head + ["    SEEN.clear()", f"    {grad_line}", "    print(sorted(SEEN))", "    return SEEN.copy()",
                       "", "", f"reference = {call(*sides[0])}", f"rival = {call(*sides[1])}"]
        verdict = ('raise SystemExit("REPRODUCES: the custom rules saw different cotangents" '
                   'if not rival <= reference else 0)   # 0: fixed (a compiled run sees only what eager sees)')
    elif check == "gradient":
        mode = (
            "tight" if registry.role_of(ref) == registry.BASELINE or registry.framework_of(ref) == "torch" else "loose"
        )
        if registry.role_of(ref) == registry.VALUE:
            mode = "loose"
        rtol, atol = tolerance(prog, mode)
        loss = forward
        body = head + ([f"    loss = {loss}   # (no grad_fn: every output non-differentiable, the gradients are 0)"]
                       if loss != "loss" else []) + [
                       (f"    g = grads(loss, {xs_name})" if reentrant else
                        f"    g = torch.autograd.grad(loss, {xs_name}{AS_HARNESS}) if loss.requires_grad else "
                        f"[torch.zeros_like(x) for x in {xs_name}]"),
                       "    print([a.tolist() for a in g])", "    return [a.double() for a in g]", "", "",
                       f"reference = {call(*sides[0])}", f"rival = {call(*sides[1])}",
                       f"RTOL, ATOL = {rtol:.3g}, {atol:.3g}   # the harness's tolerance",
                       "bad = [k for k, (a, b) in enumerate(zip(rival, reference))",
                       "       if not torch.allclose(a, b, rtol=RTOL, atol=ATOL * max(1.0, b.abs().max().item()))]"]
        verdict = (
            'raise SystemExit(f"REPRODUCES: gradients {bad} differ beyond the tolerance" if bad else 0)   # 0: fixed'
        )
    else:  # error
        stage = (
            _second_order(prog, fn if "backend" in vary else "f", args, xs_name)
            if prog.diff.order == 2
            else [grad_line]
        )
        body = (
            head
            + ["    try:"]
            + [f"        {x}" for x in stage]
            + [
                "    except Exception as e:",
                "        print('  raised', f'{type(e).__name__}: {e}'[:500])",
                "        return e",
                "    print('  raised nothing')",
                "",
                "",
            ]
        )
        body += [f"reference = {call(*sides[0])}"] if len(sides) > 1 else []
        body.append(f"rival = {call(*sides[-1])}")
        exp = finding.detail.get("expected") if isinstance(finding.detail.get("expected"), dict) else None
        if exp:
            typ = "" if exp.get("type", ".*") == ".*" else f"re.search({exp['type']!r}, type(rival).__name__) and "
            cond = f"not (rival and {typ}re.search({exp.get('regex', '')!r}, str(rival)))"
            verdict = f'raise SystemExit("REPRODUCES: expected an error, none (or another) raised" if {cond} else 0)'
        elif finding.error_type == torch_table.HOOKS_LEFT_DISABLED:   # the run leaves saved-tensor hooks disabled
            body.append("left = not torch._C._autograd._saved_tensors_hooks_is_enabled()   # after the run")
            body.append("print('  saved-tensor hooks afterwards:', 'disabled' if left else 'enabled')")
            verdict = ('raise SystemExit("REPRODUCES: saved-tensor hooks stay disabled after the run" if left else 0)'
                       "   # 0: fixed")
        else:
            et = finding.error_type
            verdict = (f'raise SystemExit("REPRODUCES: it raises {et}" if type(rival).__name__ == {et!r} else 0)'
                       f"   # 0: fixed")
    body_src = "\n".join(body)
    code_all = defs + fsrc + body_src + verdict
    imports = []
    pre_src = "\n".join(pre)
    for cond, line in (
        ("re.search(" in code_all, "import re"),
        ("Counter(" in pre_src, "from collections import Counter"),
        ("partial(" in code_all, "from functools import partial"),
        (True, "import torch"),
        ("TorchDispatchMode" in pre_src, "from torch.utils._python_dispatch import TorchDispatchMode"),
        ("partitioners." in pre_src, "from torch._functorch import partitioners"),
        ("aot_module_simplified(" in pre_src, "from torch._functorch.aot_autograd import aot_module_simplified"),
        ("make_boxed_func(" in pre_src, "from torch._functorch.aot_autograd import make_boxed_func"),
    ):
        if cond:
            imports.append(line)
    cp = [x for x in ("CheckpointPolicy", "create_selective_checkpoint_contexts") if x in code_all + pre_src]
    if has_ck and "remat" not in vary:
        cp.insert(0, "checkpoint")
    if cp:
        imports.append(f"from torch.utils.checkpoint import {', '.join(cp)}")
    A = "A." in code_all
    if A:
        pre.insert(0, "A = torch.ops.aten")
    if names:
        pre.insert(0, "NAMED = {}   # checkpoint name -> its value (the tag op records it)")
    if "remat" in vary:
        pre += ["", "", "def checkpoint(fn, *args, **kw):   # REMAT False: the no-checkpoint reference",
                "    return torch.utils.checkpoint.checkpoint(fn, *args, **kw) if REMAT else fn(*args)"]
    ins = []
    for i in prog.inputs:
        lit = f"torch.tensor({array_text(inputs[i.id], i.dtype)}, dtype=torch.{i.dtype}" + (
            ", requires_grad=True)" if i.diff else ")   # not differentiated")
        ins.append(f"{e.n[i.id]} = {lit}")
    sentence = {"residuals": ("{P}'s partitioner recomputes in the backward graph what its policy marks MUST_SAVE "
                              "(the joint graph's tags against the backward graph's nodes)." if recount and ref is None
                              else "{P} recomputes in the backward what its policy marks to save (the backward's "
                              "aten ops counted with and without checkpoint)." if recount else
                              "{P} saves other tensors for backward than {R} (a saved_tensors_hooks listing)."),
                "custom_rule": "The autograd.Function's backward gets other cotangents under {P} than under {R}.",
                "gradient": "{P} computes gradients that differ from {R} beyond the tolerance.",
                "error": ""}[check].format(P=pipe, R=ref) or error_sentence(finding, ref)
    parts = [header(finding, sentence), "\n".join(imports), TAG if names else "", "\n".join(pre),
             used_helpers(torch_table.PRELUDE, code_all), "\n".join(ins), defs, fsrc, body_src, verdict]
    return "\n\n\n".join(x.strip("\n") for x in parts if x.strip()) + "\n"


def _second_order(prog, fn, args, xs):
    mode = prog.diff.mode
    if mode == "reverse":
        return [f"gs = torch.autograd.grad({fn}({args}), {xs}, create_graph=True)",
                f"torch.autograd.grad(sum(g.sum() for g in gs), {xs})"]
    if mode == "rev_over_fwd":   # grad of the jvp of the loss along ones
        return ["import torch.autograd.forward_ad as fwAD",
                "with fwAD.dual_level():",
                f"    jvp = fwAD.unpack_dual({fn}(*[fwAD.make_dual(x, torch.ones_like(x)) for x in {xs}])).tangent",
                f"gs = torch.autograd.grad(jvp, {xs}, allow_unused=True, materialize_grads=True)",
                "[(g.float() if g.dtype == torch.bfloat16 else g).numpy() for g in gs]   # read as the harness does"]
    if mode == "fwd_over_rev":   # forward-mode AD (tangent ones) through the backward pass: the jvp of grad
        return ["import torch.autograd.forward_ad as fwAD",
                "with fwAD.dual_level():",
                f"    duals = [fwAD.make_dual(x, torch.ones_like(x)) for x in {xs}]",
                f"    gs = torch.autograd.grad({fn}(*duals), duals, create_graph=True)",
                "    [fwAD.unpack_dual(g).tangent for g in gs]"]
    raise ReproError(f"second order ({mode}) has no short PyTorch form (use --full)")
