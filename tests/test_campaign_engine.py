"""The campaign engine: one finding per root behaviour, time shares, live progress, coverage."""
from __future__ import annotations

import io
import json
import time
from collections import Counter
from types import SimpleNamespace

from conformance.cli.progress import Progress, status_line
from conformance.engine.campaign import Campaign
from conformance.engine.findings import Finding
from conformance.engine.options import Options
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import Shares, merge_finding, same_behaviour, shard_of
from conformance.engine.store import Store
from conformance.pipelines import registry
from conformance.reporting.summary import summary_markdown
from generators.programs import Config
from generators.swarm import COMPOSITIONS
from oracles.expectations import Expectations
from tests.mutants import ExtraUnnamedResidual, PerturbGradient

TWIN = "jax:mutant-perturb-gradient-twin"
registry.register_instance(PerturbGradient(registry.derive("jax:remat3", TWIN, variant="remat2")))


def _finding(pipeline, features=("sin",), reproduces=()):
    return Finding(signature=f"gradient|{pipeline}|{'+'.join(features)}", check="gradient", pipeline=pipeline,
                   reference="jax:none", features=list(features), program={}, program_hash="0" * 16,
                   reproduces=[list(k) for k in reproduces])


def test_siblings_that_reproduce_each_other_are_one_behaviour():
    a_key, b_key = ("gradient", "p:a", "jax:none", ""), ("gradient", "p:b", "jax:none", "")
    a, b = _finding("p:a", reproduces=[b_key]), _finding("p:b", reproduces=[a_key])
    assert same_behaviour(a, b)
    fs = [a]
    kept, changed = merge_finding(fs, b)
    assert fs == [a] and kept is a and not changed and a.count == 2
    # one-sided: b's program does not fail on a's pipeline -> two behaviours
    c = _finding("p:c")
    a2 = _finding("p:a", reproduces=[("gradient", "p:c", "jax:none", "")])
    assert not same_behaviour(a2, c)
    fs = [a2]
    merge_finding(fs, c)
    assert len(fs) == 2


def test_a_campaign_files_one_finding_for_a_bug_shared_by_two_pipelines(tmp_path):
    names = list(registry.REFERENCES) + ["jax:mutant-perturb-gradient", TWIN]
    # (float32 and float64: the mutant's perturbation is within a 16-bit dtype's tolerance, and
    # relu programs in those dtypes are often skipped at their kink, so not every program would count; the
    # composition dimensions left out: the mutant perturbs plain programs, and effects and state cost seconds each)
    opts = Options(pipelines=names, budget=600, max_examples=12, round_size=6, seed=1, shrink_steps=30,
                   generator=Config(max_stmts=3, dtypes=("float32", "float64"), exclude=COMPOSITIONS))
    camp = Campaign(opts, Store(tmp_path / "out"), InProcessExecutor(), Expectations.load())
    camp.run()
    mine = [f for f in camp.findings if f.check == "gradient" and f.reference == "jax:none"]
    assert camp.checked >= 8
    assert len(mine) == 1, [f.signature for f in mine]
    assert set(mine[0].behaviour_pipelines()) == {"jax:mutant-perturb-gradient", TWIN}
    assert mine[0].count >= camp.checked - 1     # every later program counted under it
    summary = summary_markdown(camp, {"versions": {}})
    assert "## Behaviours by pipeline" in summary and "## Feature coverage" in summary


def test_shares_keep_an_expensive_family_within_its_share():
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3:jit"]
    sh = Shares(names, {"jax:jit": 0.2})
    # (a program whose hash falls within every declared program share: only the family share decides)
    prog = SimpleNamespace(features=lambda: {"sin"}, content_hash=lambda: "0" * 16, types=lambda: {})
    sh.checking = 100.0                          # 100 s of checking (the wall clock does not count: a shrink's
    assert "jax:remat3:jit" in sh.select(prog, names)   # minutes buy no family more programs)
    sh.spent["jax:jit"] = 50.0                   # far over 20% of 100 s
    got = sh.select(prog, names)
    assert "jax:remat3:jit" not in got and "jax:remat3" in got
    assert {"ref:f64", "jax:none", "jax:remat2"} <= set(got)   # references always run
    assert sh.skipped["jax:remat3:jit"] == 1
    # within its share, it runs on a program with a feature it has covered least
    sh.spent["jax:jit"] = 15.0
    sh.covered["jax:jit"] = Counter({"sin": 10, "cos": 0})
    assert "jax:remat3:jit" not in sh.select(prog, names)
    prog2 = SimpleNamespace(features=lambda: {"cos"}, content_hash=lambda: "0" * 16, types=lambda: {})
    assert "jax:remat3:jit" in sh.select(prog2, names)
    # the clock is what every pipeline spent on the programs checked, references included
    sh.account(prog, {"ref:f64": SimpleNamespace(timings={"forward": 30.0, "backward": 20.0})})
    assert sh.checking == 150.0
    sh.spent["jax:jit"] = 29.0                   # under 20% of 150 s, over 20% of 100 s
    assert "jax:remat3:jit" in sh.select(prog2, names)


def test_shards_partition_program_identities():
    ids = [(f"{i:016x}", i % 7) for i in range(400)]
    parts = [{x for x in ids if shard_of(x[0], x[1], 3) == k} for k in range(3)]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == len(ids)
    assert all(40 < len(p) < 200 for p in parts)
    assert all(shard_of(h, s, 1) == 0 for h, s in ids)


def _fake_campaign():
    return SimpleNamespace(elapsed=lambda: 12.0, checked=30, findings=[1, 2, 3, 4], new_findings=lambda: [1, 2],
                           tracked_roots=lambda: {"a.json": [3]}, opts=SimpleNamespace(budget=60.0),
                           shrinking={0: {"key": ["error", "jax:remat3", "expectations", "none"], "size": 4,
                                          "original_size": 20, "steps": 17, "since": time.monotonic() - 9.0}})


def test_status_line_says_what_is_shrunk_and_for_how_long():
    line = status_line(_fake_campaign())
    # (the new findings, and the corpus roots seen: not the --known corpus's findings never seen)
    assert "programs 30 (2.50/s)" in line and "findings 2, known seen 1" in line and "left 48s" in line
    assert "shrinking error:jax:remat3" in line and "to 4 stmts (from 20)" in line and "step 17, 9s" in line


def test_plain_progress_is_never_silent_for_long():
    out = io.StringIO()
    p = Progress(out, interval=0.3, live=False)
    p.start(_fake_campaign())
    deadline = time.monotonic() + 60   # nothing happens: the heartbeat alone must write lines
    while len(out.getvalue().splitlines()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    p.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert all("shrinking" in x for x in lines)


class _TwoBugs(PerturbGradient, ExtraUnnamedResidual):
    """Wrong gradients and one extra residual on every program: two behaviours per program."""


TWO_BUGS = "jax:mutant-two-bugs"
registry.register_instance(_TwoBugs(registry.derive("jax:remat3", TWO_BUGS, variant="remat2")))


def test_every_new_behaviour_of_one_program_is_shrunk(tmp_path):
    """A program that fails two unrelated checks gives two findings, both shrunk from it: the
    second behaviour is not lost because the first one was shrunk first."""
    names = list(registry.REFERENCES) + ["jax:remat2", TWO_BUGS]
    opts = Options(pipelines=names, budget=600, max_examples=1, round_size=1, seed=3, shrink_steps=20,
                   generator=Config(max_stmts=2))
    store = Store(tmp_path / "out")
    camp = Campaign(opts, store, InProcessExecutor(), Expectations.load())
    camp.run()
    assert camp.checked == 1
    keys = {(f.check, f.pipeline, f.reference) for f in camp.findings}
    assert ("gradient", TWO_BUGS, "jax:none") in keys and ("residuals", TWO_BUGS, "jax:remat2") in keys, keys
    records = [r for r in store.results()[0] if r.get("type") in ("result", "finding")]
    (result,) = [r for r in records if r["type"] == "result"]
    origins = {tuple(r["origin"]) for r in records if r["type"] == "finding"}
    assert origins == {(result["hash"], result["seed"])}
    assert {tuple(k)[:3] for k in result["new"]} >= {("gradient", TWO_BUGS, "jax:none"),
                                                   ("residuals", TWO_BUGS, "jax:remat2")}


def test_a_behaviour_the_budget_left_unshrunk_is_filed_as_seen(tmp_path):
    """The budget runs out while the program's first behaviour is shrunk: its second behaviour is a finding all
    the same, unshrunk (it was lost from findings.json; under load the crash-and-hang campaign lost its hang)."""
    names = list(registry.REFERENCES) + ["jax:remat2", TWO_BUGS]
    opts = Options(pipelines=names, budget=600, max_examples=1, round_size=1, seed=3, shrink_steps=20,
                   generator=Config(max_stmts=2))
    store = Store(tmp_path / "out")
    camp = Campaign(opts, store, InProcessExecutor(), Expectations.load())
    spent = camp.over_budget
    camp.over_budget = lambda grace=0.0: bool(camp.findings) or spent(grace)   # spent once the first is filed
    camp.run()
    assert camp.checked == 1
    by_key = {(f.check, f.pipeline, f.reference): f for f in camp.findings}
    assert set(by_key) == {("gradient", TWO_BUGS, "jax:none"), ("residuals", TWO_BUGS, "jax:remat2")}, set(by_key)
    first, second = sorted(by_key.values(), key=lambda f: f.first_seen)
    assert first.shrunk and not second.shrunk and second.shrink_steps == 0
    assert second.size == second.original_size and TWO_BUGS in second.detail["observations"]
    assert {r["key"][0] for r in store.results()[0] if r.get("type") == "finding"} == {"gradient", "residuals"}


def test_two_findings_of_one_program_keep_two_corpus_entries(tmp_path):
    """Two behaviours shrunk to the same program (eager SAC against JAX, and compiled against
    eager SAC, torch campaign seed 21) are two corpus entries, each with its own finding."""
    camp = Campaign(Options(pipelines=["jax:remat3"]), Store(tmp_path / "out"), None, None)
    a = _finding("p:a").model_copy(update={"program_hash": "ab" * 8})
    b = _finding("p:b").model_copy(update={"program_hash": "ab" * 8})
    for f in (a, b):
        camp.handle({"ev": "finding", "finding": f.model_dump(mode="json"), "origin": ["ab" * 8, 0],
                     "target": list(f.key()), "shrink_steps": 1, "size": 1, "original_size": 1})
    files = sorted(p.name for p in (tmp_path / "out" / "corpus").glob("*.json"))
    assert files == ["gradient-p_a-abababab.json", "gradient-p_b-abababab.json"]
    pipes = {json.loads((tmp_path / "out" / "corpus" / n).read_text())["finding"]["pipeline"] for n in files}
    assert pipes == {"p:a", "p:b"}


def test_a_campaign_checks_what_its_coverage_rounds_generate(tmp_path):
    """Round r of a campaign checks the programs Coverage generates for it alone (the same seed, the
    same focus), so the focus of a round depends on nothing the campaign found."""
    from conformance.engine.search import Coverage
    opts = Options(pipelines=list(registry.REFERENCES), budget=600, max_examples=12, round_size=4, seed=5,
                   shrink_steps=5, generator=Config(max_stmts=2))
    store = Store(tmp_path / "out")
    camp = Campaign(opts, store, InProcessExecutor(), Expectations.load())
    camp.run()
    results = [r for r in store.results()[0] if r.get("type") == "result"]
    cov = Coverage(opts)
    by_round: dict[int, set] = {}
    for r in results:
        by_round.setdefault(r["round"], set()).update(r["features"])
    assert set(by_round) == {0, 1, 2}
    focused = set()
    for r, feats in by_round.items():
        assert feats <= cov.generated(r), (r, feats - cov.generated(r))
        focused |= feats & set(cov.focus(r))
    assert cov.focus(1) and focused, "no focused round checked a feature it aimed at"


def test_a_replay_runs_the_findings_own_reference():
    """A :jit rival's run set brings jax:remat2 (eager) only; its trace-count finding against
    jax:remat2:jit is judged against that reference on replay (else it is skipped, 'fixed': the
    CI gate, seed 4343)."""
    from conformance.engine.search import replay_pipelines
    names = replay_pipelines(("trace_count", "jax:remat3+cvjp3:jit", "jax:remat2:jit", "primal_traces"))
    assert "jax:remat2:jit" in names and names[-1] == "jax:remat3+cvjp3:jit"
    assert "jax:remat2:jit" not in replay_pipelines(("gradient", "jax:remat3", "jax:remat2", ""))


def test_a_shrink_that_ends_in_a_known_behaviour_closes_its_key(tmp_path):
    """A finding event that folds into a finding already there (the same behaviour) sets its key's
    shrink count to the cap, so no searcher shrinks that key again; a new behaviour does not."""
    camp = Campaign(Options(pipelines=["jax:remat3"], max_shrinks_per_key=3), Store(tmp_path / "out"), None, None)
    a = _finding("p:a").model_copy(update={"program_hash": "ab" * 8})
    b = _finding("p:b").model_copy(update={"program_hash": "cd" * 8})

    def send(f):
        camp.handle({"ev": "finding", "finding": f.model_dump(mode="json"), "origin": [f.program_hash, 0],
                     "target": list(f.key()), "shrink_steps": 1, "size": 1, "original_size": 1})
    send(a)
    send(b)
    assert camp.shrinks_per_key[a.key()] == 0 and camp.shrinks_per_key[b.key()] == 0   # both new
    send(a.model_copy(update={"program_hash": "ef" * 8}))   # a again: nothing new
    assert camp.shrinks_per_key[a.key()] == 3 and camp.shrinks_per_key[b.key()] == 0
    assert len(camp.findings) == 2


def test_an_explorer_runs_again_only_when_its_share_holds_its_next_program():
    from conformance.pipelines import registry as reg
    costly, other = reg.EXPLORERS[0], reg.EXPLORERS[1]
    sh = Shares([costly, other], explore=True)
    assert sh._explore(100.0)   # neither has run: the first programs spread them
    sh.explorer_spent[other], sh.explorer_runs[other] = 6.0, 1   # over its ceiling (5%): out of the way
    sh.explorer_spent[costly], sh.explorer_runs[costly] = 3.0, 1
    cap = sh.explorer_shares()[costly] * 100.0
    assert 3.0 < cap < 6.0      # under its share, but one more program of its mean cost would take it over
    assert sh._explore(100.0) == []
    prog = SimpleNamespace(features=lambda: {"sin"}, content_hash=lambda: "0" * 16, types=lambda: {})
    sh.account(prog, {costly: SimpleNamespace(timings={"forward": 0.0})})   # a second, cheap run: mean 1.5 s
    assert sh.explorer_runs[costly] == 2 and sh._explore(100.0) == [costly]


def test_explorers_together_stay_within_their_share_first_runs_included():
    from conformance.engine.search import EXPLORE_SHARE
    from conformance.pipelines import registry as reg
    sh = Shares(list(reg.EXPLORERS[:3]), explore=True)
    ran = reg.EXPLORERS[0]
    sh.explorer_spent[ran], sh.explorer_runs[ran] = EXPLORE_SHARE * 100.0 + 1.0, 1   # one warm-up over the whole share
    assert sh._explore(100.0) == []   # the two never run wait, though a first run is free of its own share
    assert sh._explore(200.0)         # until the share has grown past what was spent


def test_each_searcher_explores_its_own_part_of_the_explorers():
    from conformance.pipelines import registry as reg
    names = list(reg.CORE_PIPELINES) + list(reg.EXPLORERS)
    parts = [Shares(names, explore=True, part=(i, 3)).explorers for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(reg.EXPLORERS)                # every explorer, by one searcher each
    assert not set(parts[0]) & set(parts[1]) and all(parts)
    # a backend's explorers in one part: its first compile (inductor's imports and C++ toolchain) is paid once
    for warm in {reg.warm_up_of(n) for n in reg.EXPLORERS}:
        assert sum(any(reg.warm_up_of(n) == warm for n in p) for p in parts) == 1, warm
    assert reg.warm_up_of("torch:compile-inductor") == reg.warm_up_of("torch:compile-inductor:prefer") != \
        reg.warm_up_of("torch:compile-aot_eager:prefer")
    assert Shares(names, explore=True).explorers == list(reg.EXPLORERS)   # one searcher: all of them
    prog = SimpleNamespace(features=lambda: {"checkpoint"}, content_hash=lambda: "0" * 16, types=lambda: {})
    chosen = Shares(names, explore=True, part=(0, 3)).select(prog, names)
    assert not set(chosen) & (set(parts[1]) | set(parts[2]))   # another searcher's explorers are not its rivals


def test_a_shrink_never_brings_in_a_construct_the_original_lacked():
    from conformance.engine.search import Target, shrink_constructs
    # a wrong gradient of a ref written in a region in a fori_loop (the program a make run shrank into
    # checkpoint_name_fwd's root before this rule)
    original = {"checkpoint", "checkpoint_in_scan", "fori_loop", "region_state", "state_write", "switch", "float16",
                "policy:dots", "op:sin"}
    t = Target(key=("gradient", "jax:remat3", "jax:none", ""), program=None, seed=0, verdict=None, observations={},
               original_size=20, origin=("h", 0), started=0.0, constructs=shrink_constructs(original))
    prog = lambda *f: SimpleNamespace(features=lambda: set(f))   # noqa: E731
    assert not t.admits(prog("checkpoint", "names", "names_fwd", "op:name_fwd", "policy:save_only_names"))
    assert not t.admits(prog("checkpoint", "region_state", "state_accumulate"))
    assert t.admits(prog("checkpoint", "region_state", "state_write", "float32", "policy:nothing", "op:neg"))
    assert t.admits(prog("checkpoint", "scan", "cond", "checkpoint_in_scan", "region_state"))   # plain spellings
    assert t.admits(prog("checkpoint", "region_state", "nondiff_input", "sequential_regions"))   # left by deletions


def test_of_the_explorers_never_run_the_cheapest_family_runs_first():
    from conformance.pipelines import registry as reg
    compiled = next(n for n in reg.EXPLORERS if reg.family_of(n) == "torch:compile")
    eager = next(n for n in reg.EXPLORERS if reg.family_of(n) == "torch:eager")
    core_compiled = next(n for n in reg.CORE_PIPELINES if reg.family_of(n) == "torch:compile")
    core_eager = next(n for n in reg.CORE_PIPELINES if reg.family_of(n) == "torch:eager")
    sh = Shares([core_compiled, core_eager, compiled, eager], explore=True)
    prog = SimpleNamespace(features=lambda: {"sin"}, content_hash=lambda: "0" * 16, types=lambda: {})
    sh.account(prog, {core_compiled: SimpleNamespace(timings={"forward": 2.0}),
                      core_eager: SimpleNamespace(timings={"forward": 0.01})})
    assert sh._explore(100.0) == [eager]
    sh.account(prog, {eager: SimpleNamespace(timings={"forward": 0.01})})
    assert sh._explore(100.0) == [compiled]   # now the one never run


def test_a_shrunk_finding_is_replayed_for_its_siblings_on_its_frameworks_pipelines_only():
    """The replay of a shrunk program on every registered pipeline (53) ran each torch.compile, export and
    inductor variant on a JAX finding's program: seconds for siblings that only an error type's name could
    share. A JAX finding's replay runs JAX's pipelines; a torch finding's runs torch's, with the JAX pipelines
    its comparisons read (torch:eager-sac's residuals and gradients against jax:remat2)."""
    from conformance.engine.search import sibling_pipelines
    every = registry.known_names()
    jax = sibling_pipelines(("error", "jax:remat3", "expectations", "ValueError"), every)
    assert jax and all(registry.framework_of(n) == "jax" for n in jax)
    assert set(jax) == {n for n in every if registry.framework_of(n) == "jax"}
    torch = sibling_pipelines(("residuals", "torch:eager-sac", "jax:remat2", "missing"), every)
    assert {n for n in every if registry.framework_of(n) == "torch"} <= set(torch)
    assert {"ref:f64", "jax:remat2"} <= set(torch) and "jax:remat3" not in torch
    # the campaign's own set only: a pipeline it does not run is not replayed
    assert sibling_pipelines(("error", "jax:remat3", "expectations", "ValueError"),
                             ["ref:f64", "jax:remat3", "torch:none"]) == ["ref:f64", "jax:remat3"]
