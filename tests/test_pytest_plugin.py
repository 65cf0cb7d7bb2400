"""The pytest plugin (`pytest -p remat_conformance ...`) run as a framework engineer runs it: from a
directory outside this repository, under xdist, with a JUnit report."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.engine.loading import load_corpus_variants

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "regressions"


def pytest_outside(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "remat_conformance", "-p", "no:cacheprovider",
                           "-q", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900)


# the slow tier (make test-slow, nightly): a copy of the project as another checkout, its corpus replayed
# and its properties run (about a minute)
@pytest.mark.slow
def test_replays_the_corpus_and_runs_the_properties_from_another_checkout(tmp_path):
    junit = tmp_path / "junit.xml"
    r = pytest_outside(tmp_path, "--remat-pipelines", "jax:remat3", "--remat-examples", "3", "--remat-budget", "300",
                       "-n", "2", f"--junitxml={junit}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    ids = {(c.get("classname").split(".")[-2:][0], c.get("classname").split(".")[-1], c.get("name")): c for c in cases}
    # one case per corpus entry about jax:remat3 (its own or a sibling), named pipeline::check::behaviour
    want = set()
    for p in REG.glob("*.json"):
        if p.name == "status.json":
            continue
        for name, _, _, f in load_corpus_variants(str(p)):
            if f.pipeline == "jax:remat3" or any(k[1] == "jax:remat3" for k in f.reproduces):
                want.add((f.pipeline, f.check, f"{p.stem}/{name}"))
    assert want and want <= set(ids), sorted(want - set(ids))[:5]
    assert any(c.find("skipped") is not None and "open:" in c.find("skipped").get("message", "") for c in cases)
    camp = ids[("jax:remat3", "campaign", "seed-0")]
    assert camp.find("failure") is None and camp.find("error") is None and camp.find("skipped") is None


def test_inactive_without_its_options_and_a_bad_pipeline_is_a_usage_error(tmp_path):
    r = pytest_outside(tmp_path, "--co")
    assert r.returncode == 5 and "remat-conformance" not in r.stdout   # no tests collected, none of ours
    r = pytest_outside(tmp_path, "--remat-pipelines", "jax:remat9")
    assert r.returncode == 4 and "--remat-pipelines: unknown pipeline(s) ['jax:remat9']" in r.stderr


def test_the_property_test_fails_on_a_behaviour_the_corpus_does_not_track(tmp_path):
    empty = tmp_path / "corpus"
    empty.mkdir()
    (empty / "status.json").write_text(json.dumps({"fixed": {}}))
    # seed 3: its first six programs show a remat3 behaviour (any behaviour: the corpus is empty)
    r = pytest_outside(tmp_path, "--remat-pipelines", "jax:remat3", "--remat-examples", "6", "--remat-budget", "300",
                       "--remat-shrink-steps", "10", "--remat-seed", "3", "--remat-corpus", str(empty))
    assert r.returncode == 1, r.stdout[-2000:]
    assert (
        "that the corpus does not track" in r.stdout
        and "replay: remat-conformance run --pipelines jax:remat3" in r.stdout
    )


def test_collects_by_entry_point_name_without_autoload_and_counts_its_tests(tmp_path):
    import os
    want = 1 + sum(1 for p in REG.glob("*.json") if p.name != "status.json"
                   for _, _, _, f in load_corpus_variants(str(p))
                   if f.pipeline == "jax:remat2" or any(k[1] == "jax:remat2" for k in f.reproduces))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "remat_conformance",
            "-p",
            "no:cacheprovider",
            "--co",
            "-q",
            "--remat-pipelines",
            "jax:remat2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert r.returncode == 0 and f"{want} tests collected" in r.stdout, r.stdout[-1500:] + r.stderr[-1500:]
    assert "remat-conformance::jax:remat2::campaign::seed-0" in r.stdout
