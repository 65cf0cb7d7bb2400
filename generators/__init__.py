"""Hypothesis strategies that build programs, policies and inputs from the op and policy
tables. Imports the program layer (conformance.ir, ops, policy) and hypothesis only."""
