"""Command line: remat-conformance run | replay | pipelines | report | repro | recheck | matrix | devices.

Exit codes: 0 the harness worked (whatever it found); 1 with --strict when there are
unexpected findings; 2 usage or input errors, printed as `error: FILE: FIELD: reason`
(or naming the option), never with a traceback; 70 an internal error (a harness bug), one
line, the traceback only with --debug; 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from conformance import __version__
from conformance.cli import devices as devices_command
from conformance.cli import matrix as matrix_command
from conformance.cli import recheck as recheck_command
from conformance.cli import releases as releases_command
from conformance.cli import report as report_command
from conformance.cli import repro as repro_command
from conformance.cli.progress import Progress
from conformance.engine.campaign import Campaign
from conformance.engine.describe import (
    behaviour_title,
    by_class,
    class_label,
    class_rank,
    triage_of,
    variants_of,
    variants_text,
)
from conformance.engine.environments import mark_running
from conformance.engine.isolation import IsolatedExecutor, load_plugins
from conformance.engine.isolation.supervisor import MEMORY_ENV
from conformance.engine.loading import load_known, load_program_file
from conformance.engine.options import Options, add_run_flags, options_from_args, positive, seed
from conformance.engine.parallel import worker_memory_limit
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import replay_pipelines
from conformance.engine.store import Store, StoreError
from conformance.errors import UsageError
from conformance.ir import releases
from conformance.ir.nodes import Limits
from conformance.pipelines import registry as reg
from conformance.reporting.issue_text import issue_text_or_reason
from conformance.reporting.refresh import refresh_issue_texts
from conformance.reporting.summary import campaign_run, summary_markdown
from generators.programs import input_values
from oracles.expectations import Expectations
from oracles.judge import judge

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
EXIT_INTERNAL = 70   # a bug of this harness (EX_SOFTWARE); the traceback only with --debug


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"error: {message}\n(see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)


def _add_limits(p):
    g = p.add_argument_group("input limits (checked before anything runs)")
    g.add_argument("--max-rank", type=positive(int, "--max-rank"), default=3)
    g.add_argument("--max-dim", type=positive(int, "--max-dim"), default=64)
    g.add_argument("--max-elements", type=positive(int, "--max-elements"), default=4096)
    g.add_argument("--max-depth", type=positive(int, "--max-depth"), default=6)
    g.add_argument("--max-statements", type=positive(int, "--max-statements"), default=400)
    g.add_argument("--max-name-length", type=positive(int, "--max-name-length"), default=64)


def _limits(args):
    return Limits(max_rank=args.max_rank, max_dim=args.max_dim, max_elements=args.max_elements,
                  max_depth=args.max_depth, max_statements=args.max_statements,
                  max_name_length=args.max_name_length)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="remat-conformance", description="Differential testing of rematerialization in JAX and PyTorch.")
    p.add_argument("--version", action="version", version=f"remat-conformance {__version__}")
    p.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.required = True

    r = sub.add_parser("run", help="run a campaign")
    add_run_flags(r)   # every flag, default and help from engine.options.Options

    rp = sub.add_parser("replay", help="re-run corpus entries or programs")
    rp.add_argument("files", nargs="+")
    rp.add_argument("--pipelines", default=None, help="default: the finding's pipeline, or the default set")
    rp.add_argument("--seed", type=seed, default=0, help="input seed for bare programs")
    rp.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    rp.add_argument("--expectations", default=None)
    rp.add_argument("--strict", action="store_true")
    rp.add_argument("--json", action="store_true", help="print one JSON object per file")
    _add_limits(rp)

    sub.add_parser("pipelines", help="list pipelines with framework versions and devices")
    for m in PLUGGED:
        m.configure_parser(sub)
        for c in getattr(m, "COMMANDS", (getattr(m, "COMMAND", None),)):
            COMMANDS[c] = m.main
    return p


# ---------------------------------------------------------------------------------------
def parse_pipelines(spec: str | None, explore: bool = True, skipped: dict | None = None) -> list[str]:
    """The run's pipelines: the named rivals (default: the registry's default set; without `explore`, its core
    set: the explorers are left out, not run on every program) and the references the registry says they need.
    A rival the installed releases cannot run (its framework absent, an API it runs with lacking) is left out and
    put in `skipped` with the reason, and so is a reference they cannot run; where every named one is, or the
    references' framework is absent, refused."""
    if spec is None:
        rivals = list(reg.DEFAULT_PIPELINES if explore else reg.CORE_PIPELINES)
    else:
        rivals = [s.strip() for s in spec.split(",")]
        if any(not s for s in rivals):
            raise UsageError(f"--pipelines: empty name in {spec!r}")
        for s in rivals:
            if s not in reg.known_names():
                raise UsageError(f"--pipelines: unknown pipeline {s!r}; known: {', '.join(reg.known_names())}")
    out = {r: why for r in rivals if (why := reg.unavailable(r))}
    broken: dict[str, str] = {}   # framework -> why its pipeline module does not import on this release
    for r in rivals:
        for n in ([] if r in out else reg.run_set([r])):   # the rival and the references it needs
            fw = reg.framework_of(n)
            if fw not in broken:
                try:
                    reg.get(n)
                except ImportError as e:
                    broken[fw] = f"the harness's {fw} pipelines do not import on {fw} {releases.installed(fw)}: {e}"
            if fw in broken:
                out[r] = broken[fw]
                break
    if skipped is not None:
        skipped.update(out)
    if rivals and len(out) == len(rivals):
        raise UsageError("--pipelines: this environment runs none of them: "
                         + "; ".join(f"{k}: {v}" for k, v in list(out.items())[:3]))
    # (each of them imported above); a reference the releases cannot run is left out too (torch 2.4's reentrant
    # pipelines without SAC, their residual reference): the rivals' checks against it are skipped, not failed
    return [n for n in reg.run_set([r for r in rivals if r not in out]) if not reg.unavailable(n)]


def cmd_run(args) -> int:
    from conformance.pipelines.jax import eager_cache, xla_cache
    if args.framework_defaults:   # before any pipeline module is imported: workers inherit it
        os.environ[eager_cache.DEFAULTS_ENV] = "1"
        os.environ[xla_cache.ENV] = "off"
    named = ([n.strip() for n in args.pipelines.split(",") if n.strip() in reg.known_names()] if args.pipelines
             else list(reg.DEFAULT_PIPELINES))
    devices = reg.cpu_devices_needed(named)
    if devices > 1:   # before JAX starts, here and in the workers
        os.environ.setdefault(reg.CPU_DEVICES_ENV, str(devices))
    with xla_cache.campaign_cache():
        return _run(args)


def _run(args) -> int:

    if os.environ.get("REMAT_CONFORMANCE_PLUGINS"):   # test-only pipelines (fault injection, mutants)
        load_plugins()
    explore = args.explore if args.explore is not None else args.pipelines is None
    skipped: dict[str, str] = {}
    names = parse_pipelines(args.pipelines, explore, skipped)
    if skipped and not args.quiet:
        print(f"skipped {len(skipped)} pipeline(s) these releases cannot run:", file=sys.stderr)
        for k, v in skipped.items():
            print(f"  {k}: {v}", file=sys.stderr)
    expectations = Expectations.load(args.expectations)
    known = load_known(args.known)
    if args.device == "cuda":
        if "cuda" not in reg.get(reg.value_reference()).devices():
            raise UsageError("--device cuda: no CUDA device visible to jax here")
    try:
        store = Store(args.out, overwrite=args.overwrite, resume=args.resume)
    except StoreError as e:
        raise UsageError(str(e)) from None
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    isolate = _isolate(args)
    opts = options_from_args(args, pipelines=names, jobs=jobs, isolate=isolate, explore=explore,
                             memory_limit=_memory_limit(jobs) if isolate else None,
                             expectations=str(expectations.source))
    versions = reg.versions_of(names)
    run_info = {"schema_version": 1, "harness": __version__, "options": opts.recorded(), "versions": versions,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "skipped_pipelines": skipped}
    if args.resume:
        try:
            prev = store.read_run()
            prev_results, warn = store.results()
            prev_findings = store.read_findings()
        except StoreError as e:
            raise UsageError(str(e)) from None
        if warn:
            print(f"warning: {warn}", file=sys.stderr)
        po = prev["options"] if isinstance(prev.get("options"), dict) else {}
        if not isinstance(prev.get("resumed", 0), int) or isinstance(prev.get("resumed", 0), bool):
            raise UsageError(f"{store.dir}/run.json: resumed: must be an integer")
        try:   # (options added later: a run that did not record them had their defaults)
            previous = Options.from_record(po, f"{store.dir}/run.json")
        except ValueError as e:
            raise UsageError(str(e)) from None
        for k in opts.resume_conflicts(previous):
            raise UsageError(f"--resume: option {k} differs from the interrupted run "
                             f"({po.get(k)!r} there, {run_info['options'][k]!r} now)")
        run_info["resumed"] = prev.get("resumed", 0) + 1
        run_info["started"] = prev.get("started")
    store.write_run(run_info)
    executor = _executor(opts) if jobs == 1 else None   # jobs > 1: each searcher builds its own
    progress = None if args.quiet else Progress().start()
    camp = Campaign(opts, store, executor, expectations, progress, versions,
                    issue_text=lambda f: issue_text_or_reason(f, started=run_info.get("started")))
    if args.resume:
        try:
            camp.restore(prev_results, prev_findings)
        except ValueError as e:   # a findings.json entry that does not validate
            if executor is not None:
                executor.close()
            raise UsageError(f"{store.dir}/findings.json: {str(e).splitlines()[0]}") from None
    camp.track(known)
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a CI cancel stops cleanly, like Ctrl-C
    try:
        camp.run()
    finally:
        if executor is not None:
            executor.close()
        if progress is not None:
            progress.stop()
        _refresh_issue_texts(camp, run_info)   # before summary.md, which links each issue text it finds
        store.write_summary(summary_markdown(camp, run_info))
        store.close()
    new = camp.new_findings()
    print(f"checked {camp.checked} programs in {camp.elapsed():.0f}s; {len(new)} distinct findings"
          + (f", {len(camp.tracked_roots())} known behaviours seen" if known else "")
          + (" (interrupted; resume with --resume)" if camp.interrupted else ""))
    for cls, fs in by_class(sorted(new, key=lambda f: f.signature)):   # bugs first, then questions...
        print(f" {cls}:")
        for f in fs:
            print(f"  {behaviour_title(f)} [{class_label(triage_of(f))}]: [{f.check}] {f.pipeline} vs {f.reference} "
                  f"{f.error_type or ''} x{f.count}: {', '.join(sorted(f.core_features()))}; "
                  f"{variants_text(variants_of(f), ('pipelines', 'labels', 'policies'), 4)}")
    for slug, fs in sorted(camp.tracked_roots().items(), key=lambda kv: (class_rank(kv[1][0]), kv[0])):   # bugs first
        f = fs[0]
        print(f"  known {slug}: {behaviour_title(f)} [{class_label(triage_of(f))}]: [{f.check}] {f.pipeline} "
              f"x{sum(g.count for g in fs)}")
    print(f"wrote {store.dir}/ (summary.md, findings.json, results.jsonl, corpus/)")
    if camp.interrupted:
        return 130
    return EXIT_FINDINGS if (args.strict and new) else EXIT_OK


def _refresh_issue_texts(camp, run_info: dict) -> None:
    """Each finding's issue.md rewritten with what summary.md shows of it at the end (programs of every
    piece of a resumed campaign, variants, first-seen time): it was written when the finding was first
    shrunk. A failure here is a warning: the summary is still written."""
    try:
        done = refresh_issue_texts(campaign_run(camp, run_info), create=True)
    except Exception as e:  # noqa: BLE001 - an issue text is never a reason to lose the summary
        done = None
        print(f"warning: issue texts not refreshed: {type(e).__name__}: {e}", file=sys.stderr)
    for w in (done.warnings if done is not None else []):
        print(f"warning: {w}", file=sys.stderr)


def _isolate(args) -> bool:
    if args.isolate is None:
        return os.environ.get("REMAT_CONFORMANCE_ISOLATE", "1") != "0"
    return args.isolate


def _memory_limit(jobs: int):
    """Each job's framework worker: an equal part of the machine's memory (the environment's
    REMAT_CONFORMANCE_WORKER_MEMORY_GB, when set, wins)."""
    if os.environ.get(MEMORY_ENV) or jobs == 1:
        return "default"
    return worker_memory_limit(jobs)


def _executor(opts):
    if opts.isolate:
        return IsolatedExecutor(opts.device, timeout=opts.timeout, memory_limit=opts.memory_limit)
    return InProcessExecutor(opts.device)


# ---------------------------------------------------------------------------------------
def cmd_replay(args) -> int:
    limits = _limits(args)
    expectations = Expectations.load(args.expectations)
    loaded = [(f, *load_program_file(f, limits)) for f in args.files]   # validate all before running any
    ex = InProcessExecutor(args.device)
    any_fail = False
    for path, prog, inputs, finding in loaded:
        if args.pipelines is not None:
            names = parse_pipelines(args.pipelines)
        elif finding is not None:
            names = replay_pipelines(finding.key())
        else:
            names = parse_pipelines(None)
        if inputs is None:
            inputs = input_values(prog, args.seed)
        obs = ex.run(prog, inputs, names)
        j = judge(prog, obs, expectations, args.device)
        fails = j.failures()
        keys = {v.key() for v in fails}
        if finding is not None:
            if finding.key() in keys:
                status = "still failing"
            elif fails:
                status = "now failing differently"
            else:
                status = "fixed"
        else:
            status = "failing" if fails else "passing"
        any_fail |= bool(fails)
        if args.json:
            print(json.dumps({"file": path, "status": status, "failures": [v.model_dump() for v in fails]}))
        else:
            print(f"{path}: {status}")
            for v in fails:
                print(f"  [{v.check}] {v.pipeline} vs {v.reference} {v.error_type or ''}: "
                      f"{json.dumps(v.detail)[:300]}")
    return EXIT_FINDINGS if (args.strict and any_fail) else EXIT_OK


def cmd_pipelines(args) -> int:
    rows = []
    for n in reg.known_names():
        try:
            p = reg.get(n)
            ok, why = p.available()
            v = p.versions()
            devs = ",".join(p.devices())
            role = reg.spec(n).role
            rows.append((n, role, " ".join(f"{k}={x}" for k, x in v.items() if k != "numpy"), devs,
                         "" if ok else f"unavailable: {why}"))
        except ImportError as e:
            rows.append((n, "-", "-", "-", f"framework not installed: {e}"))
    w = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<9}  {r[2]:<40}  devices={r[3]}  {r[4]}".rstrip())
    return EXIT_OK


COMMANDS = {"run": cmd_run, "replay": cmd_replay, "pipelines": cmd_pipelines}
# Modules that add subcommands: each has COMMAND (or COMMANDS), configure_parser(subparsers) and main(args) -> int.
PLUGGED = [report_command, repro_command, recheck_command, matrix_command, devices_command, releases_command]


def main(argv=None) -> int:
    mark_running()   # a release environment this process runs from is in use while it lives
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:   # a usage error (already printed, one line) or --help / --version
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return COMMANDS[args.cmd](args)
    except UsageError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as e:   # noqa: BLE001 - anything else is a harness bug: say so, in one line
        if args.debug:
            import traceback
            traceback.print_exc()
        first = (str(e).splitlines() or [""])[0][:300]
        sys.stderr.write(f"internal error (a bug of remat-conformance, please report it): {type(e).__name__}: "
                         f"{first}{'' if args.debug else ' (rerun with --debug for the traceback)'}\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
