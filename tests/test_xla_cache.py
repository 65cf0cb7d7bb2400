"""The campaign's XLA compile cache (conformance.pipelines.jax.xla_cache)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conformance.files import CACHE_ENV
from conformance.pipelines.jax import eager_cache, xla_cache

ROOT = Path(__file__).resolve().parents[1]


def test_campaigns_share_the_machines_directory_and_keep_it(monkeypatch, tmp_path):
    """Unset, a campaign uses (and creates) the machine's directory under the project's cache folder, sets
    it for its workers, and keeps it; a process outside a campaign uses the same one."""
    monkeypatch.delenv(xla_cache.ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert xla_cache.cache_dir() == str(tmp_path / "xla")
    with xla_cache.campaign_cache() as d:
        assert d == str(tmp_path / "xla") and os.path.isdir(d) and os.environ[xla_cache.ENV] == d
        Path(d, "entry-cache").write_bytes(b"x")
    assert Path(d, "entry-cache").exists() and xla_cache.ENV not in os.environ


def test_a_fresh_campaign_gets_a_directory_of_its_own_and_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv(xla_cache.ENV, xla_cache.FRESH)
    assert xla_cache.cache_dir() is None   # outside a campaign: none
    with xla_cache.campaign_cache() as d:
        assert os.path.isdir(d) and os.environ[xla_cache.ENV] == d and xla_cache.cache_dir() == d
        Path(d, "entry-cache").write_bytes(b"x")
    assert not os.path.exists(d) and os.environ[xla_cache.ENV] == xla_cache.FRESH


def test_a_killed_campaigns_directory_is_removed_by_the_next(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{xla_cache.PREFIX}{dead.pid}-abc").mkdir()
    (tmp_path / f"{xla_cache.PREFIX}{dead.pid}-abc" / "k-cache").write_bytes(b"x")
    live = tmp_path / f"{xla_cache.PREFIX}{os.getpid()}-def"
    live.mkdir()
    (tmp_path / "unrelated").mkdir()
    assert xla_cache.remove_orphans(str(tmp_path)) == [f"{xla_cache.PREFIX}{dead.pid}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "unrelated"])


def test_the_environments_choice_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(xla_cache.ENV, "off")
    with xla_cache.campaign_cache() as d:
        assert d is None and os.environ[xla_cache.ENV] == "off"
    monkeypatch.setenv(xla_cache.ENV, str(tmp_path))
    with xla_cache.campaign_cache() as d:
        assert d == str(tmp_path)
    assert tmp_path.is_dir()   # a directory the user named is theirs: kept


def test_trim_removes_the_least_recently_used_entries_only_past_its_limit(tmp_path):
    """Past the limit, the entries last read or written longest ago go first, until at most KEEP of the limit
    is left (an entry read recently is kept although written first)."""
    for k in range(4):
        (tmp_path / f"k{k}-cache").write_bytes(b"x" * 400_000)
        os.utime(tmp_path / f"k{k}-cache", (1000 + k, 1000 + k))
    os.utime(tmp_path / "k0-cache", (5000, 1000))   # k0: written first, read last
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) == 1_600_000
    assert not xla_cache.trim(str(tmp_path), limit_mb=2) and len(list(tmp_path.iterdir())) == 4
    # limit 1.5 MiB (1,572,864 bytes), keep 0.75 of it (1,179,648): the two least recently used go
    assert xla_cache.trim(str(tmp_path), limit_mb=1.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k0-cache", "k3-cache"]
    assert xla_cache.trim(str(tmp_path), limit_mb=0.5)   # keep 393,216 bytes: none of 400,000 fits
    assert list(tmp_path.iterdir()) == []


def test_the_cache_is_trimmed_every_so_many_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(xla_cache.LIMIT_ENV, "0")
    monkeypatch.setattr(xla_cache, "_runs", 0)
    (tmp_path / "k-cache").write_bytes(b"x")
    for _ in range(xla_cache.TRIM_EVERY - 1):
        xla_cache.ran(str(tmp_path))
    assert any(tmp_path.iterdir())
    xla_cache.ran(str(tmp_path))
    assert not any(tmp_path.iterdir())
    xla_cache.ran(None)   # no cache: nothing to trim


PROBE = r"""
import json, sys
from jax._src import monitoring
from conformance.pipelines import registry as P
from generators.programs import input_values
from tests.programs import named_chain
import jax
# every probe at the campaigns' XLA optimisation level (framework defaults keep XLA's own): LLVM's passes round the
# last bits otherwise, and what is compared here is the caches
jax.config.update("jax_disable_most_optimizations", True)
hits = []
monitoring.register_event_listener(lambda e, **kw: hits.append(e) if e == "/jax/compilation_cache/cache_hits" else None)
prog = named_chain()
inputs = input_values(prog, 0)
out = {}
for name in sys.argv[1:]:
    n = len(hits)
    obs = P.get(name).run(prog, inputs)
    out[name] = {"hits": len(hits) - n, "grads": obs.grads, "residuals": [r.describe() for r in obs.residuals]}
print(json.dumps(out))
"""


def _probe(cache: str, names: list[str], framework_defaults: bool = True) -> dict:
    """Each pipeline's disk-cache hits and results, in a fresh process; `framework_defaults`: JAX's own
    eager cache per flag setting (eager_cache off), where only the disk cache shares across flags."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), xla_cache.ENV: cache}
    env.pop(eager_cache.DEFAULTS_ENV, None)
    if framework_defaults:
        env[eager_cache.DEFAULTS_ENV] = "1"
    r = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pipelines_that_differ_in_flags_share_compiled_executables_and_results(tmp_path):
    """Under JAX's own eager cache, eager remat2 and remat3 compile the same HLO for this program's
    primitives: the second reads them from the disk cache (jax_remat3 is part of the in-memory key,
    so without the disk cache it compiles again), and each pipeline observes exactly what it
    observes without the cache, and with the shared eager cache. (The :jit pipelines have no eager
    part left to share: their inputs reach JAX without a compile.)"""
    names = ["jax:remat2", "jax:remat3"]
    cached = _probe(str(tmp_path), names)
    # (remat2's few hits: its own eager jit calls of one text under new jaxpr objects)
    assert cached["jax:remat3"]["hits"] > cached["jax:remat2"]["hits"] + 5
    assert any(tmp_path.iterdir())
    plain = _probe("off", names)
    assert all(plain[n]["hits"] == 0 for n in names)
    # the shared eager cache (eager_cache) serves from memory what remat3's eager primitives read
    # from disk above
    (tmp_path / "shared").mkdir()
    shared = _probe(str(tmp_path / "shared"), names, framework_defaults=False)
    assert shared["jax:remat3"]["hits"] < cached["jax:remat3"]["hits"]
    for n in names:
        for other in (plain, shared):
            assert cached[n]["grads"] == other[n]["grads"] and cached[n]["residuals"] == other[n]["residuals"]


def test_a_later_process_finds_what_an_earlier_one_compiled_and_observes_the_same(tmp_path):
    """The cache is kept between campaigns: a second process (a later campaign) on the same directory reads
    from it what the first compiled, and observes exactly what a process without the cache observes."""
    names = ["jax:remat2"]
    first = _probe(str(tmp_path), names, framework_defaults=False)
    later = _probe(str(tmp_path), names, framework_defaults=False)
    plain = _probe("off", names, framework_defaults=False)
    assert later["jax:remat2"]["hits"] > first["jax:remat2"]["hits"] + 5
    assert later == {n: {**plain[n], "hits": later[n]["hits"]} for n in names}
