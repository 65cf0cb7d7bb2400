"""A pytest plugin (entry point `remat_conformance`) for a framework's own checkout:

    pytest -p remat_conformance --remat-pipelines jax:remat3 --remat-budget 60 [-n auto]

collects, for the named pipelines, (1) one test per regression-corpus entry about them, replayed
on the installed framework: xfail while its behaviour still reproduces (an open upstream bug,
the reason names it), a pass once it no longer does, a failure when it fails differently, a skip
where the installed release cannot run it; (2) one conformance-property test per pipeline: a
short seeded campaign that fails on any behaviour the corpus does not track, with its shrunk
program and the command that replays it. Test ids read `pipeline::check::behaviour`. Inactive
(no tests, no framework imports) unless --remat-pipelines is given."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conformance.cli.recheck import recheck_entry
from conformance.engine.describe import title
from conformance.engine.loading import corpus_fixed_keys, load_corpus_root
from conformance.pipelines import registry
from oracles.expectations import Expectations

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = ROOT / "tests" / "regressions"


def pytest_addoption(parser):
    g = parser.getgroup("remat-conformance", "rematerialization conformance (remat-conformance)")
    g.addoption("--remat-pipelines", default=None, metavar="P1,P2",
                help="pipelines to check (remat-conformance pipelines lists them); activates the plugin")
    g.addoption("--remat-budget", type=float, default=60.0, metavar="SECONDS",
                help="wall-clock bound of each pipeline's conformance campaign (default 60)")
    g.addoption("--remat-examples", type=int, default=20, metavar="N",
                help="programs each pipeline's campaign checks (default 20; the same ones for one seed)")
    g.addoption("--remat-seed", type=int, default=0, help="campaign seed (default 0)")
    g.addoption("--remat-shrink-steps", type=int, default=150, metavar="N",
                help="shrink steps per new behaviour (default 150)")
    g.addoption("--remat-corpus", default=None, metavar="DIR",
                help=f"regression corpus to replay (default: {DEFAULT_CORPUS})")


def _selected(config) -> list[str] | None:
    raw = config.getoption("--remat-pipelines")
    if raw is None:
        return None
    names = [p.strip() for p in raw.split(",") if p.strip()]
    bad = [p for p in names if p not in registry.known_names()]
    if bad or not names:
        raise pytest.UsageError(f"--remat-pipelines: unknown pipeline(s) {bad or raw!r}; "
                                f"known: {', '.join(registry.known_names())}")
    return names


def _corpus(config) -> Path:
    d = Path(config.getoption("--remat-corpus") or DEFAULT_CORPUS)
    if not d.is_dir():
        raise pytest.UsageError(f"--remat-corpus: {d} is not a directory (pass the harness's tests/regressions)")
    return d


class RematCollector(pytest.Collector):
    def collect(self):
        return []


class CorpusItem(pytest.Item):
    def __init__(self, *, path_: Path, loaded: tuple, fixed: bool, **kw):
        super().__init__(**kw)
        self.entry, self.loaded, self.fixed = path_, loaded, fixed   # loaded: (program, inputs, finding)

    def runtest(self):
        prog, inputs, f = self.loaded
        r = recheck_entry(prog, inputs, f, self.fixed, f.device, Expectations.load())
        if r["status"] == "unsupported":
            pytest.skip(f"cannot run here: {r.get('why', '')}")
        if r["status"] == "still failing":
            pytest.xfail(f"open: {title(f)} ({self.entry.name})")
        if r["status"] in ("changed", "regressed"):
            raise AssertionError(f"{self.entry.name}: {r['status']}: now failing {r['failures']} "
                                 f"(recorded: {list(f.key())}); replay: remat-conformance replay {self.entry}")

    def reportinfo(self):
        return self.entry, None, self.name


class CampaignItem(pytest.Item):
    def __init__(self, *, pipeline: str, corpus: Path, **kw):
        super().__init__(**kw)
        self.pipeline, self.corpus = pipeline, corpus

    def runtest(self):
        c = self.config
        with tempfile.TemporaryDirectory(prefix="remat-plugin-") as tmp:
            known = (
                ["--known", str(self.corpus)]
                if any(p.name != "status.json" for p in self.corpus.glob("*.json"))
                else []
            )
            cmd = [sys.executable, "-m", "conformance.cli", "run", "--pipelines", self.pipeline,
                   *known, "--seed", str(c.getoption("--remat-seed")),
                   "--max-examples", str(c.getoption("--remat-examples")),
                   "--shrink-steps", str(c.getoption("--remat-shrink-steps")),
                   "--budget", f"{c.getoption('--remat-budget'):g}", "--jobs", "1", "--quiet", "--out", tmp,
                   "--overwrite"]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if r.returncode not in (0, 1):
                raise AssertionError(f"the campaign did not run (exit {r.returncode}):\n{r.stderr[-3000:]}")
            findings = json.loads((Path(tmp) / "findings.json").read_text())
        new = [f for f in findings if f.get("tracked") is None]
        if new:
            raise AssertionError(
                f"{len(new)} behaviour(s) of {self.pipeline} that the corpus does not track:\n" + "\n".join(
                    f"- [{f['check']}] {f['pipeline']} vs {f['reference']} {f['error_type'] or ''}: "
                    f"{f['signature']}\n  program: {json.dumps(f['program'])}" for f in new)
                + f"\nreplay: remat-conformance {' '.join(cmd[3:-3])} --out DIR")

    def reportinfo(self):
        return ROOT, None, self.name


def pytest_collection_modifyitems(session, config, items):
    names = _selected(config)
    if names is None:
        return
    corpus = _corpus(config)
    fixed_keys = corpus_fixed_keys(corpus)
    parent = RematCollector.from_parent(session, name="remat-conformance")
    ours = []
    for p in sorted(corpus.glob("*.json")):
        if p.name == "status.json":
            continue
        root, variants = load_corpus_root(str(p))
        for name, *loaded in variants:   # every program of a root: its variants
            f = loaded[2]
            if f is not None and (f.pipeline in names or any(k[1] in names for k in f.reproduces)):
                label = f"{p.stem}/{name}" if root is not None else p.stem
                ours.append(CorpusItem.from_parent(parent, name=f"{f.pipeline}::{f.check}::{label}", path_=p,
                                                   loaded=tuple(loaded),
                                                   fixed="|".join(f.key()) in fixed_keys or p.stem in fixed_keys))
    for n in names:
        ours.append(CampaignItem.from_parent(parent, name=f"{n}::campaign::seed-{config.getoption('--remat-seed')}",
                                             pipeline=n, corpus=corpus))
    items.extend(ours)   # and reported as collected, so that pytest's summary counts them
    session.ihook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, ours))
