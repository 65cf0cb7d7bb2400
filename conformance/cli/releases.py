"""The `env` and `bisect` subcommands: environments per framework release, and a finding's short repro bisected
over a framework's releases (conformance.engine.environments, conformance.engine.bisect)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from conformance.engine import environments as envs
from conformance.engine.bisect import CANNOT, REPRODUCES, Answer, bisect, run_script, select
from conformance.engine.findings import ReleaseRange
from conformance.engine.loading import load_program_file
from conformance.engine.store import atomic_write
from conformance.errors import UsageError
from conformance.ir import releases
from conformance.pipelines import registry
from conformance.repro.plan import ReproError
from conformance.repro.short import short_repro

COMMANDS = ("env", "bisect")


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "env", help="build (or reuse) an environment of given framework releases; prints its python",
        description="Build with uv, or reuse, a cached environment holding the given framework releases, the numpy "
                    "they support and the harness (a framework not named is not installed there; naming torch "
                    "alone brings the pinned jax for the references). Prints the environment's python: run a "
                    "campaign there with `PYTHON -m conformance.cli run ...`. At most "
                    f"{envs.MAX_ENVS} environments are kept ({envs.MAX_ENVS_ENV}), the least recently used goes "
                    f"first; they live under {envs.cache_root()}/envs ({envs.CACHE_ENV}).")
    p.add_argument("release", nargs="*", metavar="RELEASE", help="jax==VERSION and/or torch==VERSION")
    p.add_argument("--list", action="store_true", help="list the cached environments instead")
    p.add_argument("--releases", choices=releases.FRAMEWORKS, default=None,
                   help="print the releases of a framework that an environment can hold, oldest first")

    b = subparsers.add_parser(
        "bisect", help="run a finding's short repro on a framework's releases: since when, fixed where",
        description="Run a corpus root's (or entry's) short repro on the framework's releases (each in its "
                    "environment, built or reused): both ends of the range first, then bisecting, every release "
                    "where the answer changes run on both sides. Exit 1 of the repro reproduces, 0 does not, "
                    f"{releases.CANNOT_RUN} (or anything else) cannot run there: a release without an API the "
                    "repro uses is `cannot run`, never `fixed`. Prints the table and the verdict.")
    b.add_argument("target", nargs="?", metavar="ENTRY_OR_ROOT", help="a corpus root or entry (JSON)")
    b.add_argument("--framework", choices=releases.FRAMEWORKS, default=None,
                   help="the framework whose releases to try (default: the finding's; with --all: only the roots "
                        "of that framework's findings)")
    b.add_argument("--range", default=None, metavar="A..B",
                   help=f"releases from A to B, either end may be left out (default: every release from "
                        f"{releases.OLDEST['jax']} (jax) / {releases.OLDEST['torch']} (torch))")
    b.add_argument("--all", default=None, metavar="DIR", help="bisect every root of a corpus directory")
    b.add_argument("--write", action="store_true",
                   help="record each answer and verdict in the root's file (its `releases`)")
    b.add_argument("--missing", action="store_true",
                   help="with --all: only the roots without a recorded range (an interrupted --write run goes on)")
    b.add_argument("--json", default=None, metavar="FILE", help="write the bisections as JSON")
    b.add_argument("--timeout", type=float, default=600.0, help="seconds a repro may run on one release")


def main_env(args) -> int:
    if args.releases:
        print("\n".join(envs.release_list(args.releases)))
        return 0
    if args.list:
        for e in envs.listing():
            print(f"{e['path']}  {' '.join(f'{k}=={v}' for k, v in e['pins'].items())}")
        return 0
    env = envs.ensure(envs.Pins.parse(args.release), log=lambda s: print(s, file=sys.stderr))
    print(env.python)
    return 0


def _targets(args) -> list[Path]:
    if bool(args.all) == bool(args.target):
        raise UsageError("bisect: give one ENTRY_OR_ROOT, or --all DIR")
    if args.target:
        return [Path(args.target)]
    d = Path(args.all)
    if not d.is_dir():
        raise UsageError(f"--all {d}: not a directory")
    files = sorted(p for p in d.glob("*.json") if p.name != "status.json")
    if args.missing:
        files = [p for p in files if json.loads(p.read_text()).get("releases") is None]   # (absent, or null)
    return files


def bisect_one(path: Path, args, log) -> dict:
    prog, inputs, finding = load_program_file(str(path))
    if finding is None:
        raise UsageError(f"{path}: a bare program has no finding to bisect")
    own = registry.framework_of(finding.pipeline)
    if args.all and args.framework and own != args.framework:
        raise UsageError(f"{path}: a {own} finding (--framework {args.framework})")
    fw = args.framework or own
    try:
        src = short_repro(prog, inputs, finding, fw)
    except ReproError as e:
        raise UsageError(f"{path}: no short repro to bisect ({e})") from None
    cands = select(envs.release_list(fw), args.range, fw)
    log(f"== bisect {path.name} over {fw} {cands[0]}..{cands[-1]} ({len(cands)} releases)")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "repro.py"
        script.write_text(src)

        def ask(release: str):
            try:
                env = envs.ensure(envs.Pins(**{fw: release}), log=log)
            except UsageError as e:   # no environment of that release: it cannot run there
                return Answer(release, CANNOT, None, 0.0, str(e))
            return run_script(env.python, script, release, args.timeout)

        b = bisect(fw, src, cands, ask, log=log, anchors=tuple(
            str(releases.parse(v)) for k, v in finding.versions.items() if k == fw))   # (2.14.1+cu130: 2.14.1)
    return {"path": path, "bisection": b}


def _write(path: Path, record: dict) -> None:
    obj = json.loads(path.read_text())
    if "variants" not in obj:
        raise UsageError(f"{path}: --write records release ranges on corpus roots (a file with variants)")
    ReleaseRange.model_validate(record)
    obj["releases"] = record
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def main_bisect(args) -> int:
    log = lambda s: print(s, file=sys.stderr)   # noqa: E731
    out, failed = [], {}
    for p in _targets(args):
        try:
            r = bisect_one(p, args, log)
        except UsageError as e:
            if not args.all:
                raise
            failed[p.name] = str(e)
            log(f"== {p.name}: skipped: {e}")
            continue
        b = r["bisection"]
        print(f"\n{p.name} ({b.framework})")
        print("\n".join("  " + x for x in b.table()))
        print(f"  verdict: {b.verdict()}")
        if args.write:
            _write(p, b.record())
        out.append({"root": p.name, **b.as_json()})
    if args.json:
        atomic_write(Path(args.json), json.dumps({"bisections": out, "skipped": failed}, indent=1) + "\n")
    if args.all:
        reg = sum(1 for o in out if o["last_good"])
        print(f"\n{len(out)} bisected ({reg} regressions, "
              f"{sum(1 for o in out if o['fixed_in'])} fixed in a release tried, "
              f"{sum(1 for o in out if REPRODUCES in o['answers'].values() and not o['last_good'])} present since "
              f"the first release that runs them), {len(failed)} skipped")
    return 0


def main(args) -> int:
    return main_env(args) if args.cmd == "env" else main_bisect(args)
