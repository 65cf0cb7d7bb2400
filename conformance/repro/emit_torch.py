"""The PyTorch dialect: ops from the torch lowering table, regions as torch.utils.checkpoint
with a SAC policy_fn (the harness's adapter over its decisions for that region's policy),
custom_vjp blocks as torch.autograd.Function with set_materialize_grads(False) for
symbolic zeros."""
from __future__ import annotations

from conformance.pipelines.torch import table as torch_table
from conformance.repro.emit import Emitter


class TorchEmitter(Emitter):
    def __init__(self, prog):
        super().__init__(prog)
        self.names = torch_table.program_names(prog)

    stack_fn = "torch.stack"   # scans: the default Python loop
    NON_TENSOR_OUTPUTS = (None, 3, "tag")

    def scan_loop(self, k, step, s, ind, init, xs, carry_res, ys_res):
        """A vmap-spelled loop: torch.func.vmap of its step where the pipeline says so (func_vmap),
        else the Python loop."""
        loop = super().scan_loop(k, step, s, ind, init, xs, carry_res, ys_res)
        if s.spelling != "vmap":
            return loop
        vm = (f"{ind}    {self.tuple_(ys_res)} = torch.func.vmap(lambda *x: {step}((), x)[1])"
              f"({', '.join(xs)})")
        return [f"{ind}if OPTS.get(\"func_vmap\"):", vm, f"{ind}else:"] + ["    " + line for line in loop]
    stop_fn = "{}.detach()"

    def op_text(self, op, args, params, nondiff):
        return torch_table.op_text(op, args, params, nondiff)

    def zeros(self, vid: str) -> str:
        shp, dtype = self.types[vid]
        return f"torch.zeros({tuple(shp)!r}, dtype=dt({dtype!r}))"

    def region(self, s, path, ind, nd):
        k = self.next_id()
        fn = f"region_{k}"
        params, pro, ret, call, read = self.region_spelling(s, k)
        res = self.tuple_([self.n[r] for r in s.results])
        src = [f"def {fn}({', '.join(params)}):", f"    \"\"\"Checkpoint region {path}.\"\"\""] + pro
        src += self.body(s.body, "    ", path + ".body", nd) + [f"    return {ret}", ""]
        decisions = torch_table.region_decisions(s.policy, self.names)
        src += ["# what the region's policy decides: (IR op kind, batched) or ('name', checkpoint name)",
                f"decisions_{k} = {decisions!r}",
                f"ctx_{k} = {{p: context_fn(decisions_{k}, p) for p in (False, True)}}", ""]
        self.defs.append("\n".join(src))
        ctx = "None" if s.policy.kind == "no_policy" else f"ctx_{k}"   # None: checkpoint without SAC
        return [f"{ind}out_{k} = checkpoint({fn}, {ctx}, {', '.join(call)})", f"{ind}{res} = {read}"]

    def block(self, s, path, ind):
        cls = f"Block{self.next_id()}"
        nd, args, results, resid, cts, ndv = self.block_names(s)
        ret = [self.n[r] if r else self.zeros(a) for r, a in zip(s.bwd_results, s.args)]
        src = [f"class {cls}(torch.autograd.Function):",
               f"    \"\"\"custom_vjp block {path} (symbolic_zeros={s.symbolic_zeros}, "
               f"optimize_remat={s.optimize_remat}, nondiff args {ndv or 'none'}).\"\"\"",
               "", "    @staticmethod", f"    def forward(ctx, {', '.join(nd + args)}):"]
        if s.symbolic_zeros:
            src += [f"        flags = [bool(b) for b in ctx.needs_input_grad[{len(nd)}:]]",
                    "        if any(flags):", f"            log({path!r}, \"perturbed\", flags)",
                    "        ctx.set_materialize_grads(False)   # symbolic zeros: None cotangents"]
        src += self.body(s.fwd, "        ", path + ".fwd", nd)
        src += [f"        ctx.save_for_backward({', '.join(resid)})", f"        ctx.nondiff = {self.tuple_(nd)}"]
        if s.non_differentiable:
            src.append(f"        ctx.mark_non_differentiable({', '.join(self.n[r] for r in s.non_differentiable)})")
        src += [f"        return {results[0] if len(results) == 1 else ', '.join(results)}",
                "", "    @staticmethod"] + (["    @once_differentiable"] if s.once_differentiable else []) + [
                f"    def backward(ctx, {', '.join(cts)}):"]
        if resid:
            src.append(f"        {self.tuple_(resid)} = ctx.saved_tensors")
        if nd:
            src.append(f"        {self.tuple_(nd)} = ctx.nondiff")
        if s.symbolic_zeros:
            src.append(f"        log({path!r}, \"symbolic_zero_cts\", [{', '.join(f'{c} is None' for c in cts)}])")
            src.append(f"        log({path!r}, \"ct_kinds\", [{', '.join(f'ct_kind({c})' for c in cts)}])")
            src += [f"        {c} = {self.zeros(r)} if {c} is None else {c}" for c, r in zip(cts, s.results)]
        src += self.body(s.bwd, "        ", path + ".bwd", nd)
        if s.bwd_branch:   # a data-dependent Python branch
            src += [f"        if bool(torch.sum({cts[0]}) < 0):", f"            {ret[0]} = {ret[0]} * 2"]
        src += [f"        return {', '.join(['None'] * len(nd) + ret)}", "", ""]
        self.defs.append("\n".join(src))
        return [f"{ind}{', '.join(results)} = {cls}.apply({', '.join(ndv + args)})"]
