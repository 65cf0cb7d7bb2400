"""`remat-conformance report`: merge campaign output directories into a regression report.

inputs reads and validates run directories, build merges them (with baselines) into the
report.json object, render writes it as HTML, Markdown, JUnit and JSON, command is the CLI.

This package sits on top: it may import conformance.engine.findings, conformance.ir,
conformance.engine.store, oracles, conformance.repro (for embedded scripts) and conformance.reporting.issue_text
(the class order, titles and variants every output shows alike); it must not import
conformance.cli.
"""
