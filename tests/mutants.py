"""Deliberately broken pipelines (test-only). Each proves one oracle can fail. The PyTorch ones
(tests/torch_mutants.py) are built on first use, so that a JAX campaign does not import torch."""
from conformance.ir.observation import ErrorInfo
from conformance.pipelines.jax.pipelines import JaxRemat
from conformance.pipelines.registry import derive, register_instance, register_lazy


def _perturb(obs, off, field="grads"):
    """One element of the first value of `field` (grads, grads2) off by a relative and absolute off."""
    vals = getattr(obs, field)
    if vals:
        k = sorted(vals)[0]
        g = vals[k]
        if isinstance(g, list):
            flat = g
            while isinstance(flat[0], list):
                flat = flat[0]
            flat[0] = flat[0] * (1 + off) + off
        else:
            vals[k] = g * (1 + off) + off


class DropNamedResidual(JaxRemat):
    """Reports one named residual fewer than it saved."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        named = [r for r in (obs.residuals or []) if r.names]
        if named:
            obs.residuals.remove(named[0])


class PerturbGradient(JaxRemat):
    """Gradients off by a relative 1e-3 in one element."""
    OFF = 1e-3   # relative and absolute error added to one gradient element

    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        _perturb(obs, self.OFF)


class SwallowError(JaxRemat):
    """Hides any error the framework raised, returning no values."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if obs.error is not None:
            obs.error = None
            obs.grads, obs.outputs, obs.residuals = {}, [], []


class RaiseOnMatmul(JaxRemat):
    """Raises where nothing should: on any program with a matrix product."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if obs.error is None and ({"matmul", "batch_matmul"} & program.features()):
            obs.error = ErrorInfo(type="RuntimeError", message="mutant: matmul refused", stage="forward")


class MisreportCustomRule(JaxRemat):
    """Flips the perturbed flags its custom_vjp fwd rules saw."""
    FIELD = "perturbed"   # the CustomRuleLog field of flag tuples it flips

    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        for log in obs.custom_rules.values():
            setattr(log, self.FIELD, [[not b for b in flags] for flags in getattr(log, self.FIELD)])


class IgnorePolicy(JaxRemat):
    """Saves everything whatever the policy says (a silently ignored policy)."""
    def _run(self, program, inputs, obs):
        from conformance.ir.nodes import Checkpoint, walk
        from conformance.ir.policy import Everything
        saved = {}
        for s, *_ in walk(program.body):
            if isinstance(s, Checkpoint):
                saved[id(s)] = s.policy
                s.policy = Everything()
        try:
            super()._run(program, inputs, obs)
        finally:
            for s, *_ in walk(program.body):
                if isinstance(s, Checkpoint):
                    s.policy = saved[id(s)]


class SilentWrongWhereItMustRaise(PerturbGradient):
    """Declared (its entry in EXPECTATIONS, like remat3's symbolic-zeros error) to raise on
    a symbolic_zeros custom_vjp; there it raises nothing and returns wrong gradients. The
    error finding must not hide the gradient one."""
    def _run(self, program, inputs, obs):
        if "symbolic_zeros" in program.features():
            super()._run(program, inputs, obs)
        else:
            JaxRemat._run(self, program, inputs, obs)


class PerturbGradientBeyondLoose(PerturbGradient):
    """Gradients off by 10% in one element: beyond the loose float64-reference tolerance too."""
    OFF = 0.1


class ExtraUnnamedResidual(JaxRemat):
    """Reports one unnamed residual more than it saved."""
    def _run(self, program, inputs, obs):
        from conformance.ir.observation import Residual
        super()._run(program, inputs, obs)
        if obs.residuals is not None and obs.error is None:
            obs.residuals.append(Residual(cls=[], shape=[5], dtype="float32", bytes=20))


class ExtraNamedResidual(JaxRemat):
    """Reports one named residual twice (one more saved value of a named class)."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        named = [r for r in (obs.residuals or []) if r.names]
        if named and obs.error is None:
            obs.residuals.append(named[0].model_copy(deep=True))


class MisreportSymbolicZeros(MisreportCustomRule):
    """Flips the is-zero flags its symbolic_zeros bwd rules saw."""
    FIELD = "symbolic_zero_cts"


class WrongErrorWhereItMustRaise(JaxRemat):
    """Declared (EXPECTATIONS) to raise a symbolic-zeros error; raises another message instead."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if "symbolic_zeros" in program.features():
            obs.error = ErrorInfo(type="TypeError", message="mutant: an unrelated failure", stage="forward")


class MisreportFwdRan(JaxRemat):
    """Claims its custom_vjp fwd rules never ran (only the primal function did)."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        for log in obs.custom_rules.values():
            log.fwd_traces = 0


class WrongMessageWhereItMustRaise(JaxRemat):
    """Declared (EXPECTATIONS) to raise a ValueError about symbolic zeros; raises a ValueError
    with another message: the declared type, a different message."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if "symbolic_zeros" in program.features():
            obs.error = ErrorInfo(type="ValueError", message="mutant: shapes do not match", stage="forward")


class ReportOneResidualFewer(JaxRemat):
    """JAX's residual report, as it records it, lists one saved value fewer than the closure holds."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if obs.residual_report:
            obs.residual_report.pop()


class ReportWrongName(JaxRemat):
    """Its residual report prints a checkpoint name on a saved value that carries no such name."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if obs.residual_report:
            obs.residual_report[0].name = "mutant"


class TraceFwdTwice(JaxRemat):
    """Runs every custom_vjp fwd rule one more time than it needs (its log counts both)."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        for log in obs.custom_rules.values():
            if log.fwd_traces:
                log.fwd_traces += 1


class DropIterationResidual(JaxRemat):
    """Saves one iteration fewer of a scan's stacked named residual (its last slice dropped)."""
    def _canonical(self, program, leaves):
        import numpy as np
        out = list(leaves)
        for k, x in enumerate(leaves):
            if np.ndim(x) >= 1 and np.shape(x)[0] >= 2 and any(
                    r.names and any("@" in i for i in r.cls) for r in super()._canonical(program, [x])):
                out[k] = np.asarray(x)[:-1]
                break
        return super()._canonical(program, out)


class PerturbHVP(JaxRemat):
    """Second-order values off by a relative 1e-3 in one element, in the modes beyond reverse
    over reverse (forward over reverse, reverse over forward, linearize)."""
    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if program.diff.mode != "reverse":
            _perturb(obs, 1e-3, "grads2")


MUTANTS = {
    "jax:mutant-drop-named-residual": (DropNamedResidual, "residuals", "jax:remat2"),
    "jax:mutant-perturb-gradient": (PerturbGradient, "gradient", "jax:none"),
    "jax:mutant-swallow-error": (SwallowError, "error", "expectations"),
    "jax:mutant-raise-on-matmul": (RaiseOnMatmul, "error", "expectations"),
    "jax:mutant-misreport-custom-rule": (MisreportCustomRule, "custom_rule", "jax:remat2"),
    "jax:mutant-ignore-policy": (IgnorePolicy, "residuals", "policy"),
    "jax:mutant-silent-wrong-where-it-must-raise": (SilentWrongWhereItMustRaise, "gradient", "jax:none"),
    "jax:mutant-perturb-gradient-beyond-loose": (PerturbGradientBeyondLoose, "gradient", "jax:none"),
    "jax:mutant-extra-unnamed-residual": (ExtraUnnamedResidual, "residuals", "jax:remat2"),
    "jax:mutant-misreport-symbolic-zeros": (MisreportSymbolicZeros, "custom_rule", "jax:remat2"),
    "jax:mutant-wrong-error-where-it-must-raise": (WrongErrorWhereItMustRaise, "error", "expectations"),
    "jax:mutant-misreport-fwd-ran": (MisreportFwdRan, "custom_rule", "jax:remat2"),
    "jax:mutant-extra-named-residual": (ExtraNamedResidual, "residuals", "jax:remat2"),
    "jax:mutant-wrong-message-where-it-must-raise": (WrongMessageWhereItMustRaise, "error", "expectations"),
    "jax:mutant-report-one-residual-fewer": (ReportOneResidualFewer, "residual_report", "vjp"),
    "jax:mutant-report-wrong-name": (ReportWrongName, "residual_report", "vjp"),
    "jax:mutant-trace-fwd-twice": (TraceFwdTwice, "trace_count", "jax:remat2"),
    "jax:mutant-drop-iteration-residual": (DropIterationResidual, "residuals", "jax:remat2"),
    "jax:mutant-perturb-hvp": (PerturbHVP, "gradient", "jax:none"),
    "torch:mutant-perturb-gradient": ("TorchPerturbGradient", "gradient", "jax:remat2"),
    "torch:mutant-compiled-perturb-gradient": ("TorchCompiledPerturbGradient", "gradient", "torch:eager-sac"),
}
# The real pipeline each mutant's declaration (roles, comparisons) is derived from, and what changes.
LIKE = {"torch:mutant-perturb-gradient": ("torch:eager-sac", {}),
        "jax:mutant-report-one-residual-fewer": ("jax:remat3:jit", {"variant": "remat2"}),
        "jax:mutant-report-wrong-name": ("jax:remat3:jit", {"variant": "remat2"}),
        "torch:mutant-compiled-perturb-gradient": ("torch:compile-aot_eager", {"compile": None})}
# The error type each mutant's finding must carry, and sibling keys (check, reference, error type)
# its shrunk program must also fail: the loose float64-reference check for a 10% gradient error.
ERROR_TYPE = {
    "jax:mutant-drop-named-residual": "missing",
    "jax:mutant-perturb-gradient": "",
    "jax:mutant-swallow-error": "none",
    "jax:mutant-raise-on-matmul": "RuntimeError",
    "jax:mutant-misreport-custom-rule": "perturbed",
    "jax:mutant-ignore-policy": "saved_against_policy",
    "jax:mutant-silent-wrong-where-it-must-raise": "",
    "jax:mutant-perturb-gradient-beyond-loose": "",
    "jax:mutant-extra-unnamed-residual": "other",
    "jax:mutant-misreport-symbolic-zeros": "symbolic_zero_cts",
    "jax:mutant-wrong-error-where-it-must-raise": "TypeError",
    "jax:mutant-misreport-fwd-ran": "fwd_ran",
    "jax:mutant-extra-named-residual": "extra",
    "jax:mutant-wrong-message-where-it-must-raise": "ValueError",
    "jax:mutant-report-one-residual-fewer": "count",
    "jax:mutant-report-wrong-name": "names",
    "jax:mutant-trace-fwd-twice": "fwd_traces",
    "jax:mutant-drop-iteration-residual": "missing",
    "jax:mutant-perturb-hvp": "",
    "torch:mutant-perturb-gradient": "cross_value",
    "torch:mutant-compiled-perturb-gradient": "cross_value",
}
ALSO_FAILS = {"jax:mutant-perturb-gradient-beyond-loose": [("gradient", "ref:f64", "")],
              "torch:mutant-compiled-perturb-gradient": [("gradient", "jax:remat2", "cross_value")]}
# Generator settings a mutant's campaign narrows (besides max_stmts=4).
GENERATOR: dict[str, dict] = {
    # (second order: the mutant's dropped residual also fails there, as an error, shrunk first)
    # (a policy that saves names, a scan over xs: 13 programs to the first scan saving a named value per
    # iteration at seed 3, where without them 57 were checked, about 175 s of the suite's time with the shrink)
    # (float32 only: a 16-bit program the dropped residual makes raise was shrunk first, 290 steps of the test's 640)
    "jax:mutant-drop-iteration-residual": {"require": ("scan", "scan_xs", "checkpoint", "family:name",
                                                       "policy:save_only_names"), "second_order": False,
                                           "dtypes": ("float32",)},
    # (a region saving names: found in the 3rd program at seed 3 instead of the 37th, both)
    "jax:mutant-drop-named-residual": {"require": ("checkpoint", "family:name", "policy:save_only_names")},
    "jax:mutant-extra-named-residual": {"require": ("checkpoint", "family:name", "policy:save_only_names")},
    "jax:mutant-perturb-hvp": {"require": ("second_order", "diff_modes")},
    # an ignored policy shows only where a region has one (found on a fresh clone once the
    # generator drew from one more op family: no region recomputed a saved value in 112 programs;
    # custom rules only add statements the shrinker then keeps; so do loops, conds and second order)
    "jax:mutant-ignore-policy": {"require": ("checkpoint",), "custom_vjp": False, "custom_jvp": False,
                                 "second_order": False, "scan": False, "cond": False},
}
# Fields of a finding's detail (dotted paths) and the value each must have.
DETAIL = {"jax:mutant-wrong-message-where-it-must-raise": {"got.type": "ValueError", "expected.type": "ValueError",
                                                          "got.message": "mutant: shapes do not match"},
          "jax:mutant-wrong-error-where-it-must-raise": {"got.type": "TypeError"},
          "jax:mutant-swallow-error": {"got": None}}
# Every mutant runs with remat2's flags (no jax_custom_vjp3): like the remat2 pipelines it raises
# the documented error on a rematerialisation rule (the packaged entry names jax:remat*).
COMMON_EXPECTATIONS = [
    {"id": "mutant-rule-remat-needs-custom-vjp3", "pipelines": ["jax:mutant-*"], "features": ["rule_remat"],
     "flags": {"jax_custom_vjp3": False},
     "raises": {"type": "NotImplementedError", "regex": "requires the jax_custom_vjp3"},
     "verified_by": "tests/mutants.py (test-only)"},
    # as the packaged entry jax-both-policies-cannot-offload says of jax:remat*
    {"id": "mutant-both-policies-cannot-offload", "pipelines": ["jax:mutant-*"], "features": ["offload_in_both"],
     "diverges": {"check": "error", "error_regex": "ValueError: The return value of the policies should be a boolean",
                  "reason": "save_from_both_policies accepts only boolean policies (mutants run JAX's policies)"},
     "verified_by": "tests/mutants.py (test-only)"}]
# Expectation entries a mutant is judged with besides the packaged ones.
_MUST_RAISE_SZ = {"features": ["symbolic_zeros"], "raises": {"type": ".*", "regex": "(?i)symbolic.?zeros"},
                  "verified_by": "tests/mutants.py (test-only)"}
EXPECTATIONS = {
    "jax:mutant-wrong-error-where-it-must-raise": [
        {"id": "mutant-wrong-error-symbolic-zeros", "pipelines": ["jax:mutant-wrong-error-where-it-must-raise"],
         **_MUST_RAISE_SZ}],
    "jax:mutant-wrong-message-where-it-must-raise": [
        {"id": "mutant-wrong-message-symbolic-zeros", "pipelines": ["jax:mutant-wrong-message-where-it-must-raise"],
         "features": ["symbolic_zeros"], "raises": {"type": "ValueError", "regex": "(?i)symbolic.?zeros"},
         "verified_by": "tests/mutants.py (test-only)"}],
    "jax:mutant-silent-wrong-where-it-must-raise": [
        {"id": "mutant-must-raise-symbolic-zeros", "pipelines": ["jax:mutant-silent-wrong-where-it-must-raise"],
         "features": ["symbolic_zeros"], "raises": {"type": ".*", "regex": "(?i)symbolic.?zeros"},
         "verified_by": "tests/mutants.py (test-only)"},
    ],
}


def register_all():
    for name, (cls, _, _) in MUTANTS.items():
        like, changes = LIKE.get(name, ("jax:remat3", {"variant": "remat2"}))
        if isinstance(cls, str):   # a class of tests/torch_mutants.py
            register_lazy(derive(like, name, **changes), lambda s, c=cls: getattr(_torch_mutants(), c)(s))
        else:
            register_instance(cls(derive(like, name, **changes)))


def _torch_mutants():
    import tests.torch_mutants
    return tests.torch_mutants


register_all()
