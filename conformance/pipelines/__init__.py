"""Pipelines: the registry (every pipeline declared once, as data: registry), what a pipeline is
(base), the lowering tables' shape (tables), and one package per framework (jax, torch) that
imports its framework. Imports conformance.ir only; importing the registry loads no framework."""
