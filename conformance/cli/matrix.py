"""The `matrix` subcommand: plan | env | run | nightly over matrix.toml (conformance/engine/matrix.py)."""
from __future__ import annotations

import json
from pathlib import Path

from conformance.engine import matrix
from conformance.engine.options import positive, seed, shard
from conformance.errors import UsageError

COMMAND = "matrix"


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("matrix", help="the nightly matrix: plan, build a cell's environment, run shards",
                              description="Cells of framework versions, device and pipelines (matrix.toml), "
                                          "each run in shards.")
    p.add_argument("--file", default=str(matrix.MATRIX_FILE), help="the matrix file (default: matrix.toml)")
    sub = p.add_subparsers(dest="matrix_cmd", required=True)
    pl = sub.add_parser("plan", help="print the cells and shards")
    pl.add_argument("--github", action="store_true", help="print GitHub Actions' matrix `include` JSON")
    pl.add_argument("--devices", default="cpu,cuda", help="comma-separated devices whose cells to plan (default: all)")
    e = sub.add_parser("env", help="build a cell's environment (once) and print its interpreter")
    e.add_argument("cell")
    r = sub.add_parser("run", help="run one shard of a cell into OUT/<cell>/shard-<i>")
    r.add_argument("cell")
    r.add_argument("--shard", type=shard, default=(0, None), metavar="I/N", help="N must be the cell's shard count")
    r.add_argument("--out", default="reports/nightly")
    r.add_argument("--budget", type=positive(float, "--budget"), default=None, help="seconds (default: the cell's)")
    r.add_argument("--jobs", type=positive(int, "--jobs"), default=None)
    r.add_argument(
        "--seed", type=seed, default=None, help="campaign seed (default: the cell's; a nightly passes its date)"
    )
    r.add_argument("--resume", action="store_true", help="continue the shard's interrupted campaign")
    r.add_argument("--recheck", default=None, metavar="CORPUS",
                   help="then replay CORPUS (a corpus directory) on the cell: OUT/<cell>/recheck.json")
    n = sub.add_parser("nightly", help="every cell and shard, a recheck of every finding on every cell, one report")
    n.add_argument("--out", default="reports/nightly")
    n.add_argument(
        "--budget", type=positive(float, "--budget"), default=None, help="seconds per shard (default: each cell's)"
    )
    n.add_argument("--jobs", type=positive(int, "--jobs"), default=None)
    n.add_argument("--seed", type=seed, default=None, help="campaign seed of every cell (default: each cell's)")
    n.add_argument("--baseline", action="append", default=[], metavar="PREVIOUS_REPORT_OR_RUN",
                   help="the previous nightly's report directory (new / fixed / persisting)")
    n.add_argument("--cells", default=None, help="comma-separated subset of cells (default: all)")
    n.add_argument("--corpus", default=str(matrix.CORPUS), metavar="DIR",
                   help="the regression corpus: known behaviours, rechecked on every cell (default: tests/regressions)")


def main(args) -> int:
    cells = matrix.load_matrix(Path(args.file))
    if getattr(args, "seed", None) is not None:
        for c in cells:
            c.seed = args.seed
    if args.matrix_cmd == "plan":
        devices = [d.strip() for d in args.devices.split(",") if d.strip()]
        bad = [d for d in devices if d not in ("cpu", "cuda")]
        if bad or not devices:
            raise UsageError(f"--devices: a comma-separated list of cpu, cuda; got {args.devices!r}")
        cells = [c for c in cells if c.device in devices]
        rows = matrix.plan(cells)
        if args.github:
            print(json.dumps({"include": rows}, separators=(",", ":")))
        else:
            for c in cells:
                print(f"{c.name}: python {c.python} ({c.base}{': ' + ' '.join(c.packages) if c.packages else ''}); "
                      f"device {c.device}; {c.shards} shard(s) x {c.budget:g} s; profile {c.profile}; seed {c.seed}; "
                      f"pipelines {','.join(c.pipelines)}" + ("; framework defaults" if c.framework_defaults else "")
                      + (f"; {c.release[0]}: {c.release[1]} release(s) before the pinned one" if c.release else ""))
        return 0
    if args.matrix_cmd == "env":
        print(matrix.env_python(matrix.cell_named(cells, args.cell)))
        return 0
    if args.matrix_cmd == "run":
        c = matrix.cell_named(cells, args.cell)
        i, n = args.shard
        if n is not None and n != c.shards:
            raise UsageError(f"--shard: cell {c.name!r} has {c.shards} shards, got {i}/{n}")
        py = matrix.env_python(c)
        if c.device == "cuda" and not matrix.cuda_available(py):
            raise UsageError(f"cell {c.name!r} needs a CUDA device; none here")
        rc = matrix.run_shard(c, i, Path(args.out), py, args.budget, args.jobs, args.resume)
        if args.recheck:
            matrix.recheck_cell(c, Path(args.recheck), Path(args.out), py)
        return rc
    only = None if args.cells is None else [matrix.cell_named(cells, x).name for x in args.cells.split(",")]
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise UsageError(f"--corpus: {corpus} is not a directory")
    s = matrix.nightly([c for c in cells if only is None or c.name in only], Path(args.out), args.budget,
                       args.baseline, args.jobs, corpus=corpus)
    print(json.dumps(s, indent=1))
    return 0 if s["report_exit"] == 0 and not any(v.startswith("failed") for v in s["skipped"].values()) else 1
