"""The claims in oracles/expectations.json, checked against the installed frameworks."""

from conformance import pipelines
from generators.programs import input_values
from tests.programs import op, prog


def test_optimize_remat_with_symbolic_zeros_raises():
    p = prog([{"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s")], "results": ["s"],
               "residuals": ["x"], "cts": ["g"], "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")],
               "bwd_results": ["d"], "symbolic_zeros": True, "optimize_remat": True}])
    for name in ("ref:f64", "jax:remat2", "jax:remat3"):
        o = pipelines.get(name).run(p, input_values(p, 0))
        assert o.error is not None and o.error.type == "NotImplementedError", (name, o.error)
        assert "does not support symbolic zeros" in o.error.message
        assert o.grads is None


def test_both_policies_with_offload_raises():
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["y"], "prevent_cse": True,
               "policy": {"kind": "both", "a": {"kind": "dots"},
                          "b": {"kind": "save_and_offload_names", "saved": [], "offloaded": ["h"]}},
               "body": [op("sin", ["x"], "s"), op("name", ["s"], "h", name="h"), op("cos", ["h"], "y")]}])
    assert "offload_in_both" in p.features()
    o = pipelines.get("jax:remat2").run(p, input_values(p, 0))
    assert o.error is not None and o.error.type == "ValueError"
    assert "The return value of the policies should be a boolean" in o.error.message


def _nested(outer, inner):
    pol = lambda save: {"kind": "save_only_names", "names": ["s"]} if save else {"kind": "nothing"}
    return prog([{"kind": "checkpoint", "args": ["x"], "results": ["y"], "prevent_cse": True, "policy": pol(outer),
                  "body": [{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True,
                            "policy": pol(inner),
                            "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"),
                                     op("cos", ["s1"], "c")]},
                           op("tanh", ["c"], "y")]}])


def _saves_s(name, p):
    o = pipelines.get(name).run(p, input_values(p, 0))
    assert o.error is None, o.error
    return any("s1" in r.cls for r in o.residuals)


def test_nested_policy_precedence_differs():
    outer_saves, inner_saves = _nested(True, False), _nested(False, True)
    assert "nested_checkpoint" in outer_saves.features()
    # JAX: the outer policy decides
    assert _saves_s("jax:remat2", outer_saves) and not _saves_s("jax:remat2", inner_saves)
    # PyTorch eager SAC: the inner region's policy saving it is enough
    assert _saves_s("torch:eager-sac", inner_saves)


def test_eager_sac_double_backward_raises():
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True,
               "policy": {"kind": "save_only_names", "names": ["s"]},
               "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"), op("cos", ["s1"], "c")]}],
             order=2)
    o = pipelines.get("torch:eager-sac").run(p, input_values(p, 0))
    assert o.error is not None and "Trying to backward an extra time" in o.error.message
