"""The `devices` subcommand: the CPU-vs-GPU oracle (oracles/devices.py) over generated programs.
Every program runs on each pipeline twice, on the CPU and on --device; what differs is a finding
(not shrunk: each step would need both devices again), written as a run directory that `report`
merges like a campaign's (run.json, results.jsonl, findings.json, corpus/ with issue texts)."""
from __future__ import annotations

import time

from conformance import __version__
from conformance.engine.describe import wants_issue
from conformance.engine.findings import CorpusEntry, make_finding
from conformance.engine.loading import corpus_entry_stem
from conformance.engine.options import positive, seed
from conformance.engine.runner import InProcessExecutor
from conformance.engine.store import ResultRecord, Store, StoreError
from conformance.errors import UsageError
from conformance.pipelines import registry
from conformance.reporting.issue_text import issue_text_or_reason
from generators.programs import Config, cases, input_values
from oracles.devices import compare_devices

COMMAND = "devices"


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("devices", help="CPU against a device: the same pipelines and programs on both",
                              description="Run generated programs on each pipeline on the CPU and on --device; "
                                          "gradients within tolerance, the same canonical residuals, the same "
                                          "error status.")
    p.add_argument(
        "--pipelines", required=True, help="comma-separated pipelines (each compared with itself on the cpu)"
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="the device compared with the cpu (cpu: a self-check of the plumbing)")
    p.add_argument("--max-examples", type=positive(int, "--max-examples"), default=50)
    p.add_argument("--max-stmts", type=positive(int, "--max-stmts"), default=6)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--budget", type=positive(float, "--budget"), default=None, help="stop after this many seconds")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 when the devices disagree on some program")


def generate(n: int, s: int, max_stmts: int) -> list:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out = []

    @hseed(s)
    @settings(max_examples=n, database=None, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(Config(max_stmts=max_stmts)))
    def collect(case):
        out.append(case)
    collect()
    return out


def main(args) -> int:
    names = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    for n in names:
        if n not in registry.known_names():
            raise UsageError(f"--pipelines: unknown pipeline {n!r}; known: {', '.join(registry.known_names())}")
    if args.device == "cuda" and not any("cuda" in registry.get(n).devices() for n in names):
        raise UsageError("--device cuda: no CUDA device here (none of the pipelines lists one)")
    try:
        store = Store(args.out, overwrite=args.overwrite)
    except StoreError as e:
        raise UsageError(str(e)) from None
    store.write_run({"schema_version": 1, "harness": __version__, "versions": registry.versions_of(names),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "options": {"pipelines": names, "device": args.device, "compare": "cpu", "seed": args.seed,
                                 "max_examples": args.max_examples, "max_stmts": args.max_stmts}})
    cpu, dev = InProcessExecutor("cpu"), InProcessExecutor(args.device)
    found: dict[tuple, object] = {}   # one finding per behaviour key; later programs count
    t0, checked = time.monotonic(), 0
    for k, (prog, s) in enumerate(generate(args.max_examples, args.seed, args.max_stmts)):
        if args.budget is not None and time.monotonic() - t0 > args.budget:
            break
        checked += 1
        inputs = input_values(prog, s)
        a, b = cpu.run(prog, inputs, names), dev.run(prog, inputs, names)
        verdicts = [v for n in names for v in compare_devices(prog, n, a[n], b[n])]
        fails = [v for v in verdicts if v.status == "fail"]
        store.append_result(ResultRecord(
            hash=prog.content_hash(), seed=s, seq=k, t=round(time.monotonic() - t0, 3),
            status="fail" if fails else "pass", features=sorted(prog.features()), ran=names,
            verdicts=[[v.check, v.pipeline, v.reference, v.status, v.error_type or ""] for v in verdicts]).line())
        for v in fails:
            if v.key() in found:
                found[v.key()].count += 1
                continue
            f = found[v.key()] = make_finding(v, prog, inputs, b[v.pipeline].versions, b[v.pipeline].flags,
                                              args.device)
            stem = corpus_entry_stem(f.check, f.pipeline, f.program_hash)
            store.write_corpus(stem, CorpusEntry(program=f.program, inputs=f.inputs, finding=f,
                                                 versions=f.versions).model_dump(mode="json"))
            if wants_issue(f):   # bugs and questions: a documented or harness root has no issue text
                store.write_issue(stem, issue_text_or_reason(f))
        if fails:
            store.write_findings([f.model_dump(mode="json") for f in found.values()])
    findings = list(found.values())
    store.write_findings([f.model_dump(mode="json") for f in findings])
    store.close()
    print(f"compared {checked} programs on cpu and {args.device} over {', '.join(names)}: "
          f"{len(findings)} disagreement(s); wrote {args.out}")
    for f in findings:
        print(f"  [{f.check}] {f.pipeline} on {args.device} vs cpu {f.error_type or ''} x{f.count}")
    return 1 if (args.strict and findings) else 0
