"""The `repro` subcommand."""
from __future__ import annotations

from pathlib import Path

from conformance import pipelines as registry
from conformance.errors import UsageError
from conformance.loading import load_program_file
from conformance.options import seed
from conformance.repro.plan import ReproError, frameworks_for
from conformance.repro.script import generate

COMMAND = "repro"


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("repro", help="write a standalone reproducer script for a finding",
                              description="Print (or write) a standalone Python script, importing only the "
                                          "framework and numpy, that reproduces a corpus entry's finding.")
    p.add_argument("file", metavar="ENTRY_OR_PROGRAM", help="corpus entry (corpus/<check>-<pipeline>-<hash8>.json) or bare program JSON")
    p.add_argument("--framework", choices=registry.FRAMEWORKS, default=None,
                   help="framework of the script (default: the finding's)")
    p.add_argument("--pipeline", default=None, help="pipeline to run (default: the finding's)")
    p.add_argument("--seed", type=seed, default=0, help="input seed for bare programs (0 <= seed < 2**32)")
    p.add_argument("--out", default=None, help="write the script to FILE (default: stdout)")


def main(args) -> int:
    prog, inputs, finding = load_program_file(args.file)
    if inputs is None:
        from generators.programs import input_values
        inputs = input_values(prog, args.seed)
    fw = args.framework or frameworks_for(finding)[0]
    if args.pipeline is not None and args.pipeline not in registry.known_names():
        raise UsageError(f"--pipeline: unknown pipeline {args.pipeline!r}; known: {', '.join(registry.known_names())}")
    try:
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
