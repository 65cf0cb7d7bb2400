"""The PyTorch mutants (test-only; registered lazily by tests/mutants.py)."""
from conformance.pipelines.torch.pipelines import TorchSAC
from tests.mutants import PerturbGradient, _perturb


class TorchPerturbGradient(TorchSAC):
    """Eager SAC whose gradients are off by a relative 1e-3 in one element: besides its baseline
    (torch:none), the cross-framework check against jax:remat2 must find it (a finding of its own:
    another error type, shrunk after the baseline's from the same program)."""
    def _run(self, program, inputs, obs, device):
        super()._run(program, inputs, obs, device)
        _perturb(obs, PerturbGradient.OFF)


class TorchCompiledPerturbGradient(TorchPerturbGradient):
    """Declared as a compiled pipeline (compared with eager SAC, then JAX) but run eagerly, its
    gradients off by 1e-3: the eager-vs-compiled check's mutant (JAX disagrees the same way)."""
