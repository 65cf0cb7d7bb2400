"""Applies the framework mutant named by REMAT_FRAMEWORK_MUTANT at interpreter start (test-only; see
tests/framework_mutants.py). A Python that finds this directory on PYTHONPATH runs it before anything else."""
import os

if os.environ.get("REMAT_FRAMEWORK_MUTANT"):
    from tests.framework_mutants import apply_from_env
    apply_from_env()
