"""What "conforms" means: gradient, residual, custom-rule, cross-framework and error oracles,
the judge that applies them, and the expectations data. Pure functions over programs and
observations: they import the program layer (conformance.ir, ops, policy), observations,
verdicts and the pipeline registry's data, never a pipeline module or a framework."""
