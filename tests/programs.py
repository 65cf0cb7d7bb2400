"""Small hand-written programs shared by the harness's own tests."""
from conformance.ir.program import load_program


def prog(body, inputs=None, outputs=None, order=1):
    return load_program({
        "schema_version": 1,
        "inputs": inputs or [{"id": "x", "shape": [3], "dtype": "float64", "diff": True}],
        "body": body, "outputs": outputs or [body[-1].get("out") or body[-1]["results"][0]],
        "diff": {"order": order, "mode": "reverse"}})


def op(o, args, out, **params):
    return {"kind": "op", "op": o, "args": args, "params": params, "out": out}


def region(args, body, results, policy, prevent_cse=True):
    return {"kind": "checkpoint", "args": args, "body": body, "results": results, "policy": policy,
            "prevent_cse": prevent_cse}


def sin_cvjp(arg="t", out="s", res_name="c", symbolic_zeros=False, optimize_remat=False):
    """custom_vjp of sin whose fwd names its residual cos(t)."""
    return {"kind": "custom_vjp", "args": [arg],
            "fwd": [op("sin", [arg], out), op("cos", [arg], "c0"), op("name", ["c0"], "c1", name=res_name)],
            "results": [out], "residuals": ["c1"], "cts": ["g"],
            "bwd": [op("mul", ["g", "c1"], "dt")], "bwd_results": ["dt"],
            "symbolic_zeros": symbolic_zeros, "optimize_remat": optimize_remat}


def seed_program(dtype="float32"):
    """The seed discussion's case: remat3, a symbolic_zeros custom_vjp whose fwd has a
    checkpoint_name, inside a checkpoint region that saves only that name."""
    return prog([op("tanh", ["x"], "t"),
                 region(["t"], [sin_cvjp(symbolic_zeros=True)], ["s"], {"kind": "save_only_names", "names": ["c"]})],
                inputs=[{"id": "x", "shape": [3], "dtype": dtype, "diff": True}], outputs=["s"])


def named_chain():
    """x -> matmul W -> sin -> name a -> cos -> name b, in a region saving only 'a'."""
    body = [
        region(
            ["x", "w"],
            [
                op("matmul", ["x", "w"], "m"),
                op("sin", ["m"], "s"),
                op("name", ["s"], "na", name="a"),
                op("cos", ["na"], "c"),
                op("name", ["c"], "nb", name="b"),
                op("mul", ["nb", "na"], "y"),
            ],
            ["y"],
            {"kind": "save_only_names", "names": ["a"]},
        )
    ]
    return prog(body, inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True},
                              {"id": "w", "shape": [3, 2], "dtype": "float64", "diff": True}], outputs=["y"])
