"""The `repro` subcommand."""
from __future__ import annotations

import sys
from pathlib import Path

from conformance.engine.loading import load_program_file
from conformance.engine.options import seed
from conformance.errors import UsageError
from conformance.pipelines import registry
from conformance.repro.plan import ReproError, frameworks_for
from conformance.repro.script import generate
from conformance.repro.short import short_repro
from generators.programs import input_values

COMMAND = "repro"


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "repro",
        help="write a short standalone reproducer script for a finding (--full: the generic one)",
        description="Print (or write) a standalone Python script, importing only the "
        "framework and numpy, that reproduces a corpus entry's finding.",
    )
    p.add_argument(
        "file",
        metavar="ENTRY_OR_PROGRAM",
        help="corpus entry (corpus/<check>-<pipeline>-<hash8>.json) or bare program JSON",
    )
    p.add_argument("--framework", choices=registry.FRAMEWORKS, default=None,
                   help="framework of the script (default: the finding's)")
    p.add_argument("--pipeline", default=None, help="pipeline to run (default: the finding's)")
    p.add_argument("--seed", type=seed, default=0, help="input seed for bare programs (0 <= seed < 2**32)")
    p.add_argument("--out", default=None, help="write the script to FILE (default: stdout)")
    p.add_argument("--full", action="store_true",
                   help="write the generic script (every pipeline's settings, the harness's checker) instead of the "
                        "short one (the program as plain framework code, its evidence, exit 1 while it reproduces); "
                        "bare programs, another --framework or a --pipeline always get the generic script")


def main(args) -> int:
    prog, inputs, finding = load_program_file(args.file)
    if inputs is None:
        inputs = input_values(prog, args.seed)
    fw = args.framework or frameworks_for(finding)[0]
    if args.pipeline is not None and args.pipeline not in registry.known_names():
        raise UsageError(f"--pipeline: unknown pipeline {args.pipeline!r}; known: {', '.join(registry.known_names())}")
    src = None
    own = finding is not None and registry.framework_of(finding.pipeline) == fw
    if not args.full and own and args.pipeline in (None, finding.pipeline):
        try:
            src = short_repro(prog, inputs, finding, fw)
        except ReproError as e:   # no short form: the generic script, said so
            print(f"note: {args.file}: no short repro ({e}); writing the generic one", file=sys.stderr)
    try:
        if src is None:
            src = generate(prog, inputs, finding, fw, args.pipeline,
                           filename=Path(args.out).name if args.out else "repro.py")
    except ReproError as e:
        raise UsageError(f"{args.file}: {e}") from None
    if args.out:
        try:
            Path(args.out).write_text(src)
        except OSError as e:
            raise UsageError(f"--out {args.out}: {e.strerror}") from None
        print(f"wrote {args.out} (run: python {args.out}; exit 1 while the discrepancy reproduces)")
    else:
        print(src, end="")
    return 0
