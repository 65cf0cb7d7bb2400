"""The `recheck` subcommand: replay every corpus entry of a directory on the installed framework
versions and say, per entry, whether its behaviour is still failing, fixed, changed, or cannot run
here; with `--out`, the statuses as JSON with the versions they were seen on (a matrix cell's
record, from which the report derives the first and last version where a finding reproduces)."""
from __future__ import annotations

import json
from pathlib import Path

from conformance.engine.describe import (
    CLASS_HEADINGS,
    CLASS_ORDER,
    behaviour_title,
    root_variants,
    triage_json,
    triage_of,
    triage_text,
    variants_json,
    variants_text,
)
from conformance.engine.loading import corpus_fixed_keys, load_corpus_root
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import replay_pipelines
from conformance.engine.store import atomic_write
from conformance.errors import UsageError
from conformance.ir import releases
from conformance.ir.verdict import DEVICE_REFERENCE
from conformance.pipelines import registry
from generators.programs import input_values
from oracles.devices import compare_devices
from oracles.expectations import Expectations
from oracles.judge import judge

COMMAND = "recheck"
RECHECK_SCHEMA = 1
# still failing: the entry's key fails; changed: other verdicts of its check and pipeline fail
# instead; fixed: none do; unsupported: its pipeline cannot run here (an older release lacks it);
# not run: its check did not run (the pipeline raised first, or a residual set this release does
# not let the capture see);
# regressed: an entry listed as fixed (status.json) fails again.
STATUSES = ("still failing", "changed", "fixed", "unsupported", "not run", "regressed")


def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("recheck", help="replay every corpus entry of DIR on the installed versions",
                              description="Replay every corpus entry of DIR (a regression corpus such as "
                                          "tests/regressions, or a run directory: its corpus/) on the installed "
                                          "framework versions: still failing / changed / fixed / unsupported.")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--out", default=None, metavar="FILE", help="write the statuses and versions as JSON")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device to replay on (default: each entry's own)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when an entry's status differs from what the corpus says (fixed, changed, regressed)")


def entry_files(d: Path) -> list[Path]:
    if (d / "corpus").is_dir():
        d = d / "corpus"
    if not d.is_dir():
        raise UsageError(f"recheck DIR: {d} is not a directory")
    files = sorted(p for p in d.glob("*.json") if p.name != "status.json")
    if not files:
        raise UsageError(f"recheck DIR: {d} holds no corpus entries (*.json)")
    return files


def installed_versions() -> dict[str, str]:
    import importlib.metadata as md
    out = {}
    for fw in ("jax", "jaxlib", "torch"):
        try:
            out[fw] = md.version(fw)
        except md.PackageNotFoundError:
            pass
    return out


def recheck_entry(prog, inputs, finding, fixed: bool, device: str, expectations) -> dict:
    """The status of one corpus entry on the installed versions (`inputs` None: the entry's seed-0
    inputs); `fixed`: its key is listed under `fixed` in its corpus's status.json."""
    if inputs is None:
        inputs = input_values(prog, 0)
    if finding.reference == DEVICE_REFERENCE:   # a CPU-vs-device finding: the devices oracle again
        return _recheck_devices(prog, inputs, finding, InProcessExecutor)
    names = replay_pipelines(finding.key())
    obs = InProcessExecutor(device).run(prog, inputs, names)
    own = obs.get(finding.pipeline)
    if own is None or own.unsupported:
        why = own.unsupported if own is not None else "not run"
        return {"status": "unsupported", "why": why, "failures": []}
    j = judge(prog, obs, expectations, device)
    declared = next((v for v in j.verdicts if v.pipeline == finding.pipeline and v.status == "unsupported"), None)
    if declared is not None:   # the expectations data declares such programs unsupported on these versions
        return {"status": "unsupported", "why": str(declared.detail.get("reason", ""))[:300], "failures": []}
    judged = [v for v in j.verdicts if (v.check, v.pipeline) == (finding.check, finding.pipeline)]
    # an error check always runs (no verdict: nothing raised, nothing expected); another check may
    # not, where the pipeline raised first or its residuals were not observed: not run, never fixed
    if finding.check != "error" and not any(v.status in ("pass", "fail", "expected") for v in judged):
        why = next((str(v.detail.get("reason", "")) for v in judged if v.detail.get("reason")), "")
        return {"status": "not run", "why": f"its {finding.check} check did not run here" + (f": {why}" if why else ""),
                "failures": []}
    same = [v for v in judged if v.status == "fail"]
    keys = [list(v.key()) for v in same]
    if fixed:
        status = "regressed" if same else "fixed"
    elif list(finding.key()) in keys:
        status = "still failing"
    else:
        status = "changed" if same else "fixed"
    return {"status": status, "failures": keys}


def _recheck_devices(prog, inputs, finding, executor) -> dict:
    p = finding.pipeline
    if finding.device not in registry.get(p).devices():
        return {"status": "unsupported", "why": f"no {finding.device} device here", "failures": []}
    cpu = executor("cpu").run(prog, inputs, [p])[p]
    dev = executor(finding.device).run(prog, inputs, [p])[p]
    fails = [
        list(v.key()) for v in compare_devices(prog, p, cpu, dev) if v.status == "fail" and v.check == finding.check
    ]
    status = "still failing" if list(finding.key()) in fails else "changed" if fails else "fixed"
    return {"status": status, "failures": fails}


def _describe(root, variants) -> dict:
    """What recheck shows of a corpus file beside its status: the behaviour's title, its class
    (suggested or confirmed) and why, and its variants with counts (a root: of all its programs)."""
    f = variants[0][3]
    t = triage_of(f)
    vs = root_variants(v[3] for v in variants)
    return {"root": root.root if root is not None else None, "title": behaviour_title(f), "class": t.class_,
            "triage": triage_json(t), "triage_text": triage_text(t), "programs": len(variants),
            "variants": variants_json(vs), "variants_text": variants_text(vs, ("pipelines", "labels", "policies")),
            "first_seen": f.first_seen}


def main(args) -> int:
    d = Path(args.dir)
    files = entry_files(d)
    fixed_keys = corpus_fixed_keys(files[0].parent)
    loaded = []
    for p in files:   # validate every entry before running any
        root, variants = load_corpus_root(str(p))
        _, prog, inputs, finding = variants[0]   # a root's representative
        if finding is None:
            raise UsageError(f"{p}: a corpus entry needs a finding (a bare program has nothing to recheck)")
        loaded.append((p, prog, inputs, finding, _describe(root, variants)))
    # grouped by class, bugs first (then questions, documented behaviours, harness limits)
    rank = {c: k for k, c in enumerate(CLASS_ORDER)}
    loaded.sort(key=lambda x: (rank.get(x[4]["class"], len(rank)), x[0].name))
    expectations = Expectations.load()
    rows = []
    heading = None
    for p, prog, inputs, finding, about in loaded:
        if about["class"] != heading:
            heading = about["class"]
            print(f"== {CLASS_HEADINGS.get(heading, heading)}", flush=True)
        fixed = "|".join(finding.key()) in fixed_keys
        r = recheck_entry(prog, inputs, finding, fixed, args.device or finding.device, expectations)
        if r["status"] == "fixed":   # fixed with the installed release of the finding's framework
            fw = registry.framework_of(finding.pipeline)
            r["fixed_in"] = f"{fw} {releases.installed(fw) or '?'}"
            was = (finding.releases.answers if finding.releases else {}) or {}
            seen = [v for v, a in was.items() if a == "reproduces"]
            r["why"] = "; ".join([f"fixed in {r['fixed_in']}"]
                                 + ([f"reproduced up to {seen[-1]} when bisected"] if seen else [])
                                 + ([f"first found on {finding.versions[fw]}"] if finding.versions.get(fw) else []))
        rows.append({"entry": p.name, "key": list(finding.key()), "listed_fixed": fixed,
                     "first_found_on": finding.versions, **about, **r})
        print(f"{p.name}: {r['status']}" + (f" ({r['why']})" if r.get("why") else ""), flush=True)
        print(f"    {about['title']} [{about['triage_text']}]; "
              + (f"{about['programs']} programs; " if about["programs"] > 1 else "")
              + f"variants: {about['variants_text']}"
              + (f"; first seen {about['first_seen']:.0f} s into the campaign that found it"
                 if about["first_seen"] is not None else ""), flush=True)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}
    versions = installed_versions()
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" of {len(rows)} entries; versions: "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    by_class = {c: sum(1 for r in rows if r["class"] == c) for c in CLASS_ORDER}
    print("by class: " + ", ".join(f"{n} {c}" for c, n in by_class.items() if n))
    if args.out:
        try:
            atomic_write(Path(args.out), json.dumps({"schema_version": RECHECK_SCHEMA, "corpus": str(d),
                                                     "versions": versions, "entries": rows},
                                                    indent=1, sort_keys=True))
        except OSError as e:
            raise UsageError(f"--out {args.out}: {e.strerror}") from None
    moved = (
        counts["changed"]
        + counts["regressed"]
        + sum(1 for r in rows if r["status"] == "fixed" and not r["listed_fixed"])
    )
    return 1 if (args.strict and moved) else 0
