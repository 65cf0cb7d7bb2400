"""The JAX dialect: ops from the JAX lowering table, regions as jax.checkpoint with the
policy's JAX source, custom_vjp blocks as jax.custom_vjp built where they are called."""
from __future__ import annotations

from conformance.pipelines.jax import table as jax_table
from conformance.repro.emit import Emitter

SZ = "jax.custom_derivatives.SymbolicZero"


class JaxEmitter(Emitter):
    def op_text(self, op, args, params, nondiff):
        return jax_table.op_text(op, args, params, nondiff)

    stack_fn = "jnp.stack"
    jit_fn = "jax.jit"

    stop_fn = "jax.lax.stop_gradient({})"

    def cond_call(self, index, fns, ops):
        if len(fns) == 2:
            return f"lax.cond({index} == 1, {fns[1]}, {fns[0]}, {', '.join(ops)})"
        return f"lax.switch({index}, [{', '.join(fns)}], {', '.join(ops)})"

    def scan_loop(self, k, step, s, ind, init, xs, carry_res, ys_res):
        c = self.tuple_(carry_res)
        if s.spelling == "fori_loop":
            return [f"{ind}{c} = lax.fori_loop(0, {s.length}, lambda i, c: {step}(c, ())[0], {self.tuple_(init)}, "
                    f"unroll={s.unroll})"]
        if s.spelling == "while_loop":
            init = self.tuple_([self.stop_fn.format(a) for a in init])
            return [f"{ind}{c} = lax.while_loop(lambda ic: ic[0] < {s.length}, "
                    f"lambda ic: (ic[0] + 1, {step}(ic[1], ())[0]), (0, {init}))[1]"]
        if s.spelling == "vmap":
            return [f"{ind}{self.tuple_(ys_res)} = jax.vmap(lambda *x: {step}((), x)[1])({', '.join(xs)})"]
        return [f"{ind}{c}, {self.tuple_(ys_res)} = lax.scan({step}, {self.tuple_(init)}, "
                f"{self.tuple_(xs)}, length={s.length}, unroll={s.unroll})"]

    def value_input(self, key):
        return f"jnp.asarray(inputs[{key}]).astype(INPUT_DTYPES[{key}])"

    def zeros(self, vid: str) -> str:
        shp, dtype = self.types[vid]
        return f"jnp.zeros({tuple(shp)!r}, dt({dtype!r}))"

    def region(self, s, path, ind, nd):
        k = self.next_id()
        fn = f"region_{k}"
        params, pro, ret, call, read = self.region_spelling(s, k)
        res = self.tuple_([self.n[r] for r in s.results])
        src = [f"def {fn}({', '.join(params)}):", f"    \"\"\"Checkpoint region {path}.\"\"\""] + pro
        src += self.body(s.body, "    ", path + ".body", nd) + [f"    return {ret}", ""]
        self.defs.append("\n".join(src))
        pol = jax_table.policy_source(s.policy)
        opts = jax_table.checkpoint_options_source(s)
        if s.state != "none":   # a scalar mutable state the region closes over (prelude.with_state)
            dtype = self.types[s.results[0]][1]
            return [
                f"{ind}state_{k} = jax.new_ref(jnp.zeros((), dt({dtype!r})))",
                f"{ind}out_{k} = read_state(checkpoint(with_state({s.state!r}, state_{k})({fn}), policy={pol}{opts})"
                f"({', '.join(call)}), state_{k})",
                f"{ind}{res} = {read}",
            ]
        return [
            f"{ind}out_{k} = checkpoint({fn}, policy={pol}{opts})({', '.join(call)})",
            f"{ind}{res} = {read}",
        ]

    def jvp_block(self, s, path, ind):
        b = f"block_{self.next_id()}"
        args, results = [self.n[a] for a in s.args], [self.n[r] for r in s.results]
        tans = [self.n[t] for t in s.tangents]
        src = [f"# custom_jvp block {path}", f"def {b}_primal({', '.join(args)}):",
               "    \"\"\"The primal body (the jvp rule runs it again).\"\"\""]
        src += self.body(s.body, "    ", path + ".body", None)
        src += [f"    return {self.tuple_(results)}", "", "", f"def {b}_jvp(primals, tangents):",
                f"    {self.tuple_(args)} = primals", f"    {self.tuple_(tans)} = tangents"]
        src += self.body(s.body, "    ", path + ".body", None)
        src += self.body(s.jvp, "    ", path + ".jvp", None)
        src += [f"    return {self.tuple_(results)}, {self.tuple_([self.n[t] for t in s.jvp_results])}", "", "",
                f"def {b}(*args):",
                "    \"\"\"The custom_jvp function, built where it is called (as the harness does).\"\"\"",
                f"    log({path!r})"]
        if s.tree != "flat":   # the function takes one tuple or dict and returns one
            t = (repr(s.tree), repr(list(s.args)), repr(list(s.results)))
            src += [f"    primal, rule = tree_jvp({', '.join(t)}, {b}_primal, {b}_jvp)",
                    "    f = jax.custom_jvp(primal)", "    f.defjvp(rule)",
                    f"    return from_tree({t[0]}, {t[2]}, f(as_tree({t[0]}, {t[1]}, args)))", ""]
        else:
            src += [f"    f = jax.custom_jvp({b}_primal)", f"    f.defjvp({b}_jvp)", "    return f(*args)", ""]
        self.defs.append("\n".join(src))
        return [f"{ind}{self.tuple_(results)} = {b}({', '.join(args)})"]

    def block(self, s, path, ind):
        b = f"block_{self.next_id()}"
        nd, args, results, resid, cts, ndv = self.block_names(s)
        sig = ", ".join(nd + args)
        none = s.spelling in ("defvjp", "defremat")   # a zero cotangent is None, as users write it
        ret = [self.n[r] if r else "None" if none else self.zeros(a) for r, a in zip(s.bwd_results, s.args)]
        src = [f"# custom_vjp block {path} (symbolic_zeros={s.symbolic_zeros}, optimize_remat={s.optimize_remat}, "
               f"nondiff args {ndv or 'none'})",
               f"def {b}_rule({sig}):", "    \"\"\"The fwd statements: (results, residuals).\"\"\""]
        src += self.body(s.fwd, "    ", path + ".fwd", nd)
        src += [f"    return {self.tuple_(results)}, {self.tuple_(resid)}", "", "", f"def {b}_fwd({sig}):"]
        if s.symbolic_zeros:
            src += [f"    log({path!r}, \"perturbed\", [{', '.join(f'bool({a}.perturbed)' for a in args)}])"]
            if s.perturbed_branch:   # what fwd saw, before the values are unwrapped
                src.append(f"    perturbed = [{', '.join(f'bool({a}.perturbed)' for a in args)}]")
            src.append(f"    {', '.join(args)} = {', '.join(f'{a}.value' for a in args)}")
        tree = repr(s.residual_tree)
        if s.perturbed_branch:   # fwd marks the perturbed args in the residual pytree's structure
            src += [f"    outs, res = {b}_rule({sig})",
                    f"    return outs, mark_perturbed(pack_residuals({tree}, res), perturbed)"]
        else:
            src += [f"    outs, res = {b}_rule({sig})", f"    return outs, pack_residuals({tree}, res)"]
        src += ["", "", f"def {b}_bwd({', '.join(nd + ['res', 'cts'])}):"]
        if s.perturbed_branch:
            src.append(f"    res, keep = read_perturbed(res, {len(args)})")
        if resid:
            src.append(f"    {self.tuple_(resid)} = unpack_residuals({tree}, res)")
        src.append(f"    {self.tuple_(cts)} = cts")
        if s.symbolic_zeros:
            src.append(f'    log({path!r}, "symbolic_zero_cts", [{", ".join(f"isinstance({c}, {SZ})" for c in cts)}])')
            src += [f"    {c} = {self.zeros(r)} if isinstance({c}, {SZ}) else {c}" for c, r in zip(cts, s.results)]
        src += self.body(s.bwd, "    ", path + ".bwd", nd)
        if s.bwd_branch:   # (PyTorch: a Python if on the cotangent's sum)
            src.append(f"    {ret[0]} = jnp.where(jnp.sum({cts[0]}) < 0, {ret[0]} * 2, {ret[0]})")
        if s.perturbed_branch:   # the branch: nothing for an arg fwd saw unperturbed
            src += [f"    return tuple(c if k else None for c, k in zip({self.tuple_(ret)}, keep))", "", ""]
        else:
            src += [f"    return {self.tuple_(ret)}", "", ""]
        kw = "".join(f", {o}=True" for o in ("symbolic_zeros", "optimize_remat") if getattr(s, o))
        src += [f"def {b}_primal({sig}):", f"    return {b}_rule({sig})[0]", "", "",
                f"def {b}(*args):",
                "    \"\"\"The custom rule, built where it is called (as the harness does).\"\"\"",
                f"    log({path!r})"]
        call = "f(*args)"
        if s.tree != "flat":   # the rules take the args as one tuple or dict, return one
            t = (repr(s.tree), repr(list(s.args)), repr(list(s.results)))
            src.append(f"    primal, fwd, bwd = tree_rules({', '.join(t)}, {len(nd)}, {b}_primal, {b}_fwd, {b}_bwd)")
            call = f"from_tree({t[0]}, {t[2]}, f(*args[:{len(nd)}], as_tree({t[0]}, {t[1]}, args[{len(nd)}:])))"
        else:
            src.append(f"    primal, fwd, bwd = {b}_primal, {b}_fwd, {b}_bwd")
        if s.spelling in ("custom_gradient", "custom_gradient_remat"):
            src += [
                "    def spelled(*args):",
                "        outs, res = fwd(*args)",
                "        rem = lambda *a: (primal(*a), lambda g: bwd(fwd(*a)[1], g))",
                "        return outs, (lambda g: bwd(res, g))"
                + (" if not REMAT else rem" if s.spelling.endswith("remat") else ""),
                "    f = jax.custom_gradient(spelled" + (", remat=REMAT)" if s.spelling.endswith("remat") else ")"),
                f"    return {call}",
                "",
            ]
        elif s.spelling == "defremat":
            src += ["    f = jax.custom_vjp(primal)",
                    "    if REMAT:   # fwd saves nothing; rem recomputes the residuals from the args",
                    "        f.defremat(lambda *a: (fwd(*a)[0], ()), lambda _, *a: fwd(*a), bwd)",
                    "    else:   # outside jax.remat the same VJP as running rem right after fwd",
                    "        f.defvjp(fwd, bwd)", f"    return {call}", ""]
        else:
            src += ["    f = jax.custom_vjp(primal" + (f", nondiff_argnums={tuple(range(len(nd)))!r})" if nd else ")"),
                    f"    f.defvjp(fwd, bwd{kw})", f"    return {call}", ""]
        self.defs.append("\n".join(src))
        out = [f"{ind}{self.tuple_(results)} = {b}({', '.join(ndv + args)})"]
        for r in s.non_differentiable:   # (PyTorch: ctx.mark_non_differentiable)
            out.append(f"{ind}{self.n[r]} = lax.stop_gradient({self.n[r]})")
        return out
