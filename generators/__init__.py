"""Hypothesis strategies that build programs, policies and inputs from the op and policy
tables (programs.py; draws.py: cheap shared draws; policies.py: policy strategies). Imports the program
layer (conformance.ir) and hypothesis only."""
