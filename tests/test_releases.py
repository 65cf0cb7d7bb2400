"""What each release has (conformance.ir.releases), environments per release and bisection."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings

from conformance.cli.main import parse_pipelines
from conformance.engine import environments as envs
from conformance.engine.bisect import CANNOT, NOT, REPRODUCES, Answer, bisect, run_script, select
from conformance.engine.findings import ReleaseRange
from conformance.engine.loading import load_program_file
from conformance.engine.options import Options
from conformance.errors import UsageError
from conformance.ir import releases
from conformance.ir.features import FEATURE_NEEDS, lacking_features
from conformance.pipelines import registry
from conformance.repro.short import short_repro
from generators.programs import programs
from tests.programs import op, prog, region

ROOT = Path(__file__).resolve().parents[1]
STATIC_ARGNAMES = ROOT / "tests" / "regressions" / "remat2-ignores-static-argnames.json"


def test_every_api_named_by_a_declaration_is_declared():
    named = {n for v in FEATURE_NEEDS.values() for n in v} | {n for s in registry.SPECS.values() for n in s.needs}
    assert named and named <= set(releases.APIS)
    assert {a.framework for a in releases.APIS.values()} == set(releases.FRAMEWORKS)


@pytest.mark.parametrize("name", sorted(releases.APIS))
def test_each_probe_agrees_with_the_declared_first_release_on_the_installed_release(name):
    """The declared range and the probe a repro and a pipeline run say the same of the installed release."""
    import jax
    import torch
    api = releases.APIS[name]
    has = not releases.probe_lacking([name], {"jax": jax, "lax": jax.lax, "torch": torch})
    assert has == api.in_release(releases.installed(api.framework)), (name, releases.installed(api.framework))


def test_an_older_release_lacks_what_came_later_and_says_since_when():
    old = {"jax": "0.9.2", "torch": "2.3.1"}
    lack = releases.lacking(list(releases.APIS), old)
    assert "jax.ad_checkpoint.checkpoint_name_fwd" in lack and "custom_vjp.defremat" in lack
    assert "torch.utils.checkpoint.create_selective_checkpoint_contexts" in lack
    assert "defvjp(symbolic_zeros=)" not in lack
    assert releases.why(["jax.ad_checkpoint.checkpoint_name_fwd"], old) == (
        "jax 0.9.2 lacks jax.ad_checkpoint.checkpoint_name_fwd (first in 0.11.2)")
    assert releases.lacking(["jax.new_ref"], {"torch": "2.14.1"}) == ["jax.new_ref"]   # jax absent: lacks it all
    feats = lacking_features({"jax"}, old)
    assert {"names_fwd", "rule_remat"} <= set(feats) and "names" not in feats   # (names: a PyTorch need)


def test_a_policy_of_an_offloading_kind_that_offloads_nothing_needs_no_cpu_offload():
    """jax's save_from_both_policies ignored its second policy where the first was save_and_offload_only_these_names
    until 0.4.38 (it returned the first's decision, a truthy enum, not a bool): a campaign on 0.4.37 can draw that
    policy with nothing to offload, CPU offload to pinned_host coming only in 0.7.1."""
    from conformance.ir.policy import Both, Everything, SaveAndOffloadNames
    lack = set(lacking_features({"jax"}, {"jax": "0.4.37"}))
    assert "offloading" in lack and not {"policy:save_and_offload_only_these_names", "policy:both"} & lack
    body = [region(["x"], [op("sin", ["x"], "y")], ["y"],
                   Both(a=SaveAndOffloadNames(saved=["a"], offloaded=[]), b=Everything()).model_dump())]
    feats = prog(body).features()
    assert {"offload_in_both", "policy:both"} <= feats and "offloading" not in feats
    body[0]["policy"]["a"]["offloaded"] = ["b"]
    assert "offloading" in prog(body).features()


def _pretend(monkeypatch, **versions):
    monkeypatch.setattr(releases, "installed", lambda fw: versions.get(fw))


def test_a_campaign_on_an_old_release_skips_what_it_cannot_run_and_draws_nothing_it_lacks(monkeypatch):
    _pretend(monkeypatch, jax="0.6.2", torch="2.3.1")
    skipped: dict = {}
    names = parse_pipelines(None, True, skipped)
    assert "jax:remat3" in skipped and "jax_remat3" in skipped["jax:remat3"]
    assert "torch:eager-sac" in skipped and "first in 2.5.0" in skipped["torch:eager-sac"]
    assert "jax:remat2:jit" in names and "jax:remat3" not in names and "torch:eager-reentrant" in names
    assert "torch:eager-sac" not in names   # (the reentrant pipelines' residual reference: no SAC before 2.5)
    cfg = Options(pipelines=names).config
    assert "mutable_state" in cfg.exclude and "policy:both" not in cfg.exclude
    assert {"region_state", "names_fwd", "rule_remat", "static_argnames"} <= set(cfg.lacks)
    lacks = set(cfg.lacks)

    @settings(max_examples=60, database=None, deadline=None)
    @given(programs(cfg))
    def draws(prog):
        assert not prog.features() & lacks

    draws()


def test_naming_only_pipelines_the_release_cannot_run_is_refused(monkeypatch):
    _pretend(monkeypatch, jax="0.6.2", torch="2.14.1")
    with pytest.raises(UsageError, match="runs none of them.*jax_remat3"):
        parse_pipelines("jax:remat3,jax:remat3+cvjp3")


def test_a_pipeline_calls_a_program_it_cannot_express_on_its_release_unsupported(monkeypatch):
    from conformance.pipelines import base
    prog, inputs, _ = load_program_file(str(STATIC_ARGNAMES))
    p = registry.get("jax:remat2")
    assert p.cannot_express(prog) is None
    monkeypatch.setitem(base._PROBED, "jax", {"jax.checkpoint(static_argnames=)": False})
    assert "lacks jax.checkpoint(static_argnames=)" in p.cannot_express(prog)
    obs = p.run(prog, inputs)
    assert obs.unsupported and "static_argnames" in obs.unsupported and obs.error is None


def test_the_reentrant_torch_pipelines_run_on_a_torch_without_selective_checkpointing():
    """torch before 2.5 has no CheckpointPolicy nor create_selective_checkpoint_contexts (imitated: deleted before
    the harness imports torch's pipelines). The pipelines that take no policy still run a program with a policy (the
    reentrant implementation ignores it), where before the module did not import and every torch pipeline of a
    torch 2.4.1 campaign was skipped."""
    code = textwrap.dedent("""
        import json, torch.utils.checkpoint as c
        del c.CheckpointPolicy, c.create_selective_checkpoint_contexts
        from conformance.pipelines import registry
        from conformance.ir.program import load_program
        from generators.programs import input_values
        from tests.programs import op, prog, region
        p = prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"), op("cos", ["n"], "y")],
                         ["y"], {"kind": "save_only_names", "names": ["a"]})])
        out = {}
        for name in ("torch:none", "torch:eager-reentrant"):
            obs = registry.get(name).run(p, input_values(p, 0))
            out[name] = [obs.error and obs.error.model_dump(), obs.grads]
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["torch:eager-reentrant"][0] is None and out["torch:none"][0] is None
    assert out["torch:eager-reentrant"][1]["x"] == pytest.approx(out["torch:none"][1]["x"])


# -- the short repro tells "cannot run here" from "fixed" --------------------------------------------------------
def _run_under(tmp_path, script: str, shim: str) -> subprocess.CompletedProcess:
    """Run a script in this environment with `shim` run first (an older release's missing API, imitated)."""
    (tmp_path / "repro.py").write_text(script)
    code = shim + "\nimport runpy\nrunpy.run_path('repro.py', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_short_repro_exits_cannot_run_where_the_release_lacks_an_api_it_uses(tmp_path):
    prog, inputs, finding = load_program_file(str(STATIC_ARGNAMES))
    src = short_repro(prog, inputs, finding)
    assert "static_argnames" in src and "if LACKS: sys.exit(" in src and f"os._exit({releases.CANNOT_RUN})" in src
    assert _run_under(tmp_path, src, "").returncode == 1   # reproduces on the pinned release
    # jax.checkpoint without static_argnames (jax <= 0.9): the check would see a TypeError and say "fixed"
    old = textwrap.dedent("""
        import jax
        _ck = jax.checkpoint
        def checkpoint(fun, *, prevent_cse=True, policy=None, static_argnums=()):
            return _ck(fun, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums)
        jax.checkpoint = checkpoint
    """)
    r = _run_under(tmp_path, src, old)
    assert r.returncode == releases.CANNOT_RUN and "CANNOT RUN" in r.stdout and "static_argnames" in r.stdout


def test_a_short_repro_sets_only_the_flags_a_release_knows_and_cannot_run_without_one_it_turns_on(tmp_path):
    root = ROOT / "tests" / "regressions" / "remat3-no-zero-propagation.json"
    prog, inputs, finding = load_program_file(str(root))
    src = short_repro(prog, inputs, finding)
    assert '"jax_remat3": True' in src
    assert _run_under(tmp_path, src, "").returncode == 1
    # a release without jax_remat3: setting it raises, as jax does for an unknown option; off, it is never set
    no_flag = textwrap.dedent("""
        import jax
        _update = jax.config.update
        class Config:
            def __getattr__(self, k):
                if k == "jax_remat3":
                    raise AttributeError(k)
                return getattr(jax.config.__class__, k, None) or getattr(_real, k)
            def update(self, k, v):
                if k == "jax_remat3":
                    raise AttributeError(f"Unrecognized config option: {k}")
                return _update(k, v)
        _real = jax.config
        jax.config = Config()
    """)
    r = _run_under(tmp_path, src, no_flag)
    assert r.returncode == releases.CANNOT_RUN, r.stdout + r.stderr


# -- bisection -----------------------------------------------------------------------------------------------------
RELS = [f"0.{k}.0" for k in range(1, 11)]


def _bisect(answer_of, rels=RELS, source="print()", anchors=()):
    asked = []

    def ask(r):
        asked.append(r)
        return Answer(r, answer_of(r))
    return bisect("jax", source, rels, ask, log=lambda s: None, anchors=anchors), asked


def _minor(r):
    return int(r.split(".")[1])


def test_bisect_names_the_release_a_regression_came_with_and_runs_both_sides():
    b, asked = _bisect(lambda r: REPRODUCES if _minor(r) >= 7 else NOT)
    assert (b.first_seen, b.last_good, b.fixed_in) == ("0.7.0", "0.6.0", None)
    assert b.verdict() == "reproduces in 0.7.0-0.10.0; not in 0.6.0: introduced in 0.7.0"
    assert asked[:2] == ["0.10.0", "0.1.0"] and len(asked) <= 6   # both ends first, then bisection


def test_bisect_names_the_fix_and_a_behaviour_present_in_every_release():
    b, _ = _bisect(lambda r: REPRODUCES if _minor(r) <= 3 else NOT)
    assert b.fixed_in == "0.4.0" and b.last_good is None and "fixed in 0.4.0" in b.verdict()
    b, asked = _bisect(lambda r: REPRODUCES)
    assert b.verdict() == "reproduces in every release tried (0.1.0..0.10.0)" and len(asked) == 2


def test_bisect_never_reads_cannot_run_as_fixed_and_skips_releases_before_the_apis_the_repro_uses():
    # an older release that cannot run (an API it lacks) is stepped over, not taken for a good release
    b, _ = _bisect(lambda r: CANNOT if _minor(r) <= 4 else REPRODUCES)
    assert b.last_good is None and b.first_seen == "0.5.0"
    assert b.verdict() == "reproduces in every release tried (0.5.0..0.10.0)"
    b, asked = _bisect(lambda r: REPRODUCES, rels=["0.10.0", "0.11.0", "0.11.2", "0.12.0"],
                       source="from jax.ad_checkpoint import checkpoint_name_fwd")
    assert asked == ["0.12.0", "0.11.2"] and b.releases == ["0.11.2", "0.12.0"]   # (checkpoint_name_fwd: 0.11.2)
    rr = ReleaseRange.model_validate(b.record())
    assert rr.first_seen == "0.11.2" and rr.range == ["0.11.2", "0.12.0"]
    assert "Present since the first release tried" in rr.sentence()
    b, asked = _bisect(lambda r: REPRODUCES, rels=["0.10.0", "0.11.0"], source="checkpoint_name_fwd(x, 'a')")
    assert asked == [] and "lacks jax.ad_checkpoint.checkpoint_name_fwd" in b.answers["0.10.0"].why
    assert b.verdict().startswith("cannot run on any release tried")


def test_bisect_runs_the_release_the_finding_was_seen_on_and_finds_a_behaviour_that_came_and_went():
    b, _ = _bisect(lambda r: REPRODUCES if 5 <= _minor(r) <= 7 else NOT)
    assert b.verdict() == "does not reproduce in any release tried (0.1.0..0.10.0)"   # both ends alike
    b, asked = _bisect(lambda r: REPRODUCES if 5 <= _minor(r) <= 7 else NOT, anchors=("0.6.0",))
    assert asked[:3] == ["0.10.0", "0.1.0", "0.6.0"]
    assert (b.first_seen, b.last_good, b.fixed_in) == ("0.5.0", "0.4.0", "0.8.0")
    assert b.verdict() == "reproduces in 0.5.0-0.7.0; not in 0.4.0: introduced in 0.5.0; not in 0.8.0: fixed in 0.8.0"


def test_range_selection_and_its_errors():
    assert select(RELS, "0.3.0..0.5.0", "jax") == ["0.3.0", "0.4.0", "0.5.0"]
    assert select(RELS, "0.9.0..", "jax") == ["0.9.0", "0.10.0"]
    for bad in ("0.3.0", "x..y", "2.0..3.0"):
        with pytest.raises(UsageError, match="--range"):
            select(RELS, bad, "jax")


def test_run_script_reads_the_exit_status(tmp_path):
    for code, want in ((1, REPRODUCES), (0, NOT), (3, CANNOT), (2, CANNOT)):
        s = tmp_path / f"s{code}.py"
        s.write_text(f"import sys\nprint('CANNOT RUN: x') if {code} == 3 else None\nsys.exit({code})\n")
        a = run_script(sys.executable, s, "1.0")
        assert a.answer == want and a.exit == code
    assert "CANNOT RUN" in run_script(sys.executable, tmp_path / "s3.py", "1.0").why
    s = tmp_path / "slow.py"
    s.write_text("import time\ntime.sleep(30)\n")
    assert run_script(sys.executable, s, "1.0", timeout=1).answer == CANNOT


# -- environments ---------------------------------------------------------------------------------------------------
def test_release_specs_are_checked():
    assert envs.Pins.parse(["jax==0.6.2", "torch==2.5.1"]).label == "jax==0.6.2 torch==2.5.1"
    for bad, msg in ((["jax>=0.6"], "jax==VERSION"), (["numpy==2.0"], "jax==VERSION"), ([], "at least one"),
                     (["jax==0.4.1"], "oldest jax"), (["jax==0.6.2", "jax==0.7.0"], "given twice")):
        with pytest.raises(UsageError, match=msg):
            envs.Pins.parse(bad)


def test_an_environment_holds_numpy_1_for_releases_built_against_it():
    assert "numpy<2" in envs.requirements(envs.Pins(jax="0.4.25"))
    reqs = envs.requirements(envs.Pins(torch="2.5.1"))
    assert "numpy>=2" in reqs and any(r.startswith("jax<=") for r in reqs)   # the references' jax comes along


def test_the_least_recently_used_environments_go_first(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(envs.MAX_ENVS_ENV, "2")
    for k, name in enumerate(("jax-0.6.2", "jax-0.7.0", "jax-0.8.0")):
        d = tmp_path / "envs" / name
        d.mkdir(parents=True)
        (d / "pins.json").write_text(json.dumps({"jax": name[4:]}))
        (d / ".stamp").write_text("x")
        (d / ".used").write_text(str(100 + k))
    (tmp_path / "envs" / "partial").mkdir()   # a build that was cut off
    removed = envs.evict(keep=1, log=lambda s: None)
    assert sorted(Path(r).name for r in removed) == ["jax-0.6.2", "jax-0.7.0"]
    assert sorted(p.name for p in (tmp_path / "envs").iterdir() if not p.name.startswith(".")) == ["jax-0.8.0"]
    monkeypatch.setenv(envs.MAX_ENVS_ENV, "8")   # the size bound: a torch environment of 4.5 GB over 6 GB in all
    monkeypatch.setenv(envs.MAX_GB_ENV, "6")
    (tmp_path / "envs" / "jax-0.8.0" / ".size_mb").write_text("4500")
    assert envs.evict(keep=0, log=lambda s: None) == []
    assert [Path(r).name for r in envs.evict(keep=1, log=lambda s: None)] == ["jax-0.8.0"]   # room for one more
    # an environment a live harness process runs from stays (a campaign there); a dead process's mark does not
    d = tmp_path / "envs" / "jax-0.9.0"
    d.mkdir()
    for name, text in ((".stamp", "x"), (".used", "1"), (".size_mb", "4500"), ("pins.json", '{"jax": "0.9.0"}'),
                       (f".running-{os.getpid()}", "")):
        (d / name).write_text(text)
    assert envs.evict(keep=1, log=lambda s: None) == []
    (d / f".running-{os.getpid()}").rename(d / ".running-999999999")
    assert [Path(r).name for r in envs.evict(keep=1, log=lambda s: None)] == ["jax-0.9.0"]
    monkeypatch.setenv(envs.MAX_ENVS_ENV, "many")
    with pytest.raises(UsageError, match=envs.MAX_ENVS_ENV):
        envs.max_envs()


def test_uv_cache_is_emptied_when_it_and_the_environments_are_over_the_bound(tmp_path, monkeypatch):
    """uv keeps every wheel it ever installed (5 GB a torch release): it counts in the bound, each file once (an
    environment's files are links to the cache's), and emptying it leaves the environments whole."""
    monkeypatch.setenv(envs.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    cache, d = tmp_path / "uv", tmp_path / "envs" / "jax-0.8.0"
    (cache / "wheels").mkdir(parents=True)
    d.mkdir(parents=True)
    for name, d0 in (("pins.json", '{"jax": "0.8.0"}'), (".stamp", "x"), (".used", "1")):
        (d / name).write_text(d0)
    (cache / "wheels" / "jaxlib.so").write_bytes(b"x" * 3 * 2 ** 20)
    os.link(cache / "wheels" / "jaxlib.so", d / "jaxlib.so")          # as uv installs: a hard link
    (cache / "wheels" / "torch.so").write_bytes(b"y" * 2 * 2 ** 20)   # a release no environment holds any more
    assert 5 <= envs.size_mb(envs.envs_dir(), cache) < 5.5            # the linked file once
    monkeypatch.setenv(envs.MAX_GB_ENV, str(6 / 1024))
    assert envs.evict(keep=0, log=lambda s: None) == [] and cache.is_dir()   # within 6 MB
    monkeypatch.setenv(envs.MAX_GB_ENV, str(4 / 1024))
    said = []
    assert envs.evict(keep=0, log=said.append) == [] and not cache.exists()
    assert "emptied uv's cache" in said[0] and (d / "jaxlib.so").read_bytes()[:1] == b"x"
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "theirs"))      # a cache the user names is theirs: left alone
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "big").write_bytes(b"z" * 5 * 2 ** 20)
    envs.evict(keep=0, log=lambda s: None)
    assert (tmp_path / "theirs" / "big").exists()


@pytest.mark.slow
def test_env_builds_an_old_jax_release_the_harness_runs_in_and_a_failed_build_is_one_line(tmp_path):
    """End to end, through the package registry: `env jax==0.8.0`, then the short repro of a root whose API came
    later cannot run there (exit 3) and `bisect` over two releases says so, never `fixed`."""
    # a fresh environments folder; uv's downloads from the project's cache (the bound on it is tested apart)
    env = {**os.environ, envs.CACHE_ENV: str(tmp_path / "cache"), "UV_CACHE_DIR": str(envs.uv_cache_dir())}
    cli = [sys.executable, "-m", "conformance.cli"]
    r = subprocess.run(cli + ["env", "jax==0.8.0"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    py = r.stdout.strip()
    v = subprocess.run([py, "-c", "import jax, conformance.cli.main; print(jax.__version__)"], capture_output=True,
                       text=True)
    assert v.stdout.strip() == "0.8.0", v.stderr
    prog, inputs, finding = load_program_file(str(STATIC_ARGNAMES))
    (tmp_path / "repro.py").write_text(short_repro(prog, inputs, finding))
    ran = run_script(py, tmp_path / "repro.py", "0.8.0")   # it runs there and says what 0.8.0 lacks
    assert (ran.answer, ran.exit) == (CANNOT, releases.CANNOT_RUN) and "static_argnames" in ran.why, ran
    b = subprocess.run(cli + ["bisect", str(STATIC_ARGNAMES), "--range", "0.8.0..0.8.0", "--json",
                              str(tmp_path / "b.json")], capture_output=True, text=True, env=env, timeout=900)
    assert b.returncode == 0, b.stderr
    got = json.loads((tmp_path / "b.json").read_text())["bisections"][0]
    assert got["answers"] == {"0.8.0": "cannot run"}
    assert "lacks jax.checkpoint(static_argnames=)" in got["table"][0]["why"]
    assert "cannot run on any release tried" in b.stdout
    bad = subprocess.run(cli + ["env", "jax==0.4.18", "torch==2.2.0"], capture_output=True, text=True,
                         env={**env, "UV_OFFLINE": "1", "UV_NO_CACHE": "1"}, timeout=900)
    errors = [x for x in bad.stderr.splitlines() if x.startswith("error:")]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(errors) == 1
    assert errors[0].startswith("error: env jax==0.4.18 torch==2.2.0: installing") and "because" in errors[0].lower()


def test_a_root_fixed_upstream_is_known_on_the_releases_before_its_fix_and_new_after(monkeypatch, tmp_path):
    """status.json lists a past bug's root as fixed (a recurrence is a regression); on a release before the one it
    was bisected as fixed in, a campaign still counts it as known rather than reporting it new."""
    from conformance.engine.loading import load_known
    slug = "remat3-vmap-of-grad-checkpoint-name-no-batch-rule"
    root = json.loads((ROOT / "tests" / "regressions" / f"{slug}.json").read_text())
    assert root["releases"]["fixed_in"] == "0.11.0" and root["releases"]["answers"]["0.10.2"] == "reproduces"
    d = tmp_path / "corpus"
    d.mkdir()
    (d / f"{slug}.json").write_text(json.dumps(root))
    (d / "status.json").write_text(json.dumps({"fixed": {slug: "fixed upstream"}}))
    assert load_known([str(d)]) == []   # the pinned release has the fix
    _pretend(monkeypatch, jax="0.10.2")
    assert [f.tracked for f in load_known([str(d)])] == [f"{slug}.json"]


def test_bisect_missing_takes_the_roots_without_a_range_absent_or_null(tmp_path):
    """`bisect --all DIR --missing`: a root whose `releases` is null (a root written by a model dump before it was
    bisected) has no range either; three corpus roots were skipped that way."""
    from types import SimpleNamespace

    from conformance.cli.releases import _targets
    for name, extra in (("ranged", {"releases": {"verdict": "x"}}), ("null", {"releases": None}), ("absent", {})):
        (tmp_path / f"{name}.json").write_text(json.dumps({"variants": [], **extra}))
    (tmp_path / "status.json").write_text("{}")
    args = SimpleNamespace(all=str(tmp_path), target=None, missing=True)
    assert sorted(p.stem for p in _targets(args)) == ["absent", "null"]
    args.missing = False
    assert sorted(p.stem for p in _targets(args)) == ["absent", "null", "ranged"]
