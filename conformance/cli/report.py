"""The `report` subcommand: load run and baseline directories, build, write."""
from __future__ import annotations

from conformance.errors import UsageError
from conformance.reporting.build import build
from conformance.reporting.inputs import ReportInputError, load_run
from conformance.reporting.refresh import refresh_issue_texts
from conformance.reporting.render import write
from conformance.reporting.versions import history, load_recheck
from oracles.expectations import Expectations

COMMAND = "report"


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="merge run directories into HTML/Markdown/JUnit/JSON reports",
                              description="Merge one or many campaign output directories (shards, matrix cells) "
                                          "and compare with baselines.")
    p.add_argument("dirs", nargs="+", metavar="RESULTS_DIR")
    p.add_argument("--baseline", action="append", default=[], metavar="PREVIOUS_DIR",
                   help="an earlier run or report directory (repeat, oldest first, for a trend)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--recheck", action="append", default=[], metavar="RECHECK_JSON",
                   help="a matrix cell's recheck.json (`recheck --out`): adds first/last versions per finding")
    p.add_argument("--no-repro", action="store_true", help="do not embed repro scripts")
    p.add_argument("--strict", action="store_true", help="exit 1 when there are new findings")
    p.add_argument("--expectations", default=None, metavar="FILE",
                   help="expectations JSON for the stale-entry list (default: the packaged file; paths named "
                        "inside run directories are never opened)")


def main(args) -> int:
    try:
        runs = [load_run(d) for d in args.dirs]
        bases = [load_run(d, allow_report=True) for d in args.baseline]
        rep = build(runs, bases, with_repro=not args.no_repro, expectations=Expectations.load(args.expectations))
        rep["versions"] = history([load_recheck(f) for f in args.recheck]) if args.recheck else None
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    try:
        paths = write(rep, args.out)
    except OSError as e:
        raise UsageError(f"--out {args.out}: {e.strerror or e}") from None
    t = rep["totals"]
    print(f"{t['programs']} programs, {t['findings']} findings ({t['new']} new, {t['persisting']} persisting, "
          f"{t['fixed']} fixed); wrote " + ", ".join(str(p) for p in paths))
    for w in rep["warnings"]:
        print(f"warning: {w}")
    for r in runs:   # the results directories read (not the baselines): their existing issue texts, up to date
        done = refresh_issue_texts(r)
        if done.written:
            print(f"refreshed {len(done.written)} issue text(s) in {r.dir}/corpus/")
        for w in done.warnings:
            print(f"warning: {w}")
    return 1 if (args.strict and t["new"]) else 0
