"""`remat-conformance repro`: generated scripts are standalone and reproduce (or not) as they should.

Scripts run in a subprocess with the venv's python, in a temp dir, without PYTHONPATH and
with this project's packages blocked, so they cannot lean on the harness."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import repro
from conformance.cli.main import main as cli_main
from conformance.engine.loading import load_program_file
from tests.corpus_files import variant_path

REG = Path(__file__).parent / "regressions"
SEED = variant_path("b324b466757472b7.json")  # real: remat3 + symbolic_zeros fwd with names: must raise, does not
FIXED = variant_path("fixed-optimize-remat-sz.json")     # constructed: raises the documented error (conforms)
BLOCK = ("import runpy, sys\n"
         "for m in ('conformance', 'oracles', 'generators'):\n"
         "    sys.modules[m] = None   # the project must not be importable from a repro\n"
         "sys.argv = [sys.argv[1]]\n"
         "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def run_script(src: str, tmp_path: Path, name="repro.py", timeout=240):
    p = tmp_path / name
    p.write_text(src)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    r = subprocess.run([sys.executable, "-c", BLOCK, str(p)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def gen(path, fw, pipeline=None):
    prog, inputs, finding = load_program_file(str(path))
    return repro.generate(prog, inputs, finding, fw, pipeline)


def imports(src: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("fw", ["jax", "torch"])
def test_scripts_import_only_framework_numpy_stdlib(fw):
    for path in (SEED, FIXED, variant_path("error-ref_f64-bfa081b4.json")):
        src = gen(path, fw)
        compile(src, str(path), "exec")
        extra = imports(src) - set(sys.stdlib_module_names) - {fw, "numpy"}
        assert not extra, f"{path.name} ({fw}) imports {extra}"


def _must_raise_entry(tmp_path, pipeline="jax:remat3"):
    """The seed's program and finding, its declared error replaced by a test-only one that no jax
    raises: the script must report the missing error whether or not upstream fixes the seed bug
    (that bug's own test is its regression-corpus entry, a strict xfail)."""
    obj = json.loads(SEED.read_text())
    f = obj["finding"]
    f["pipeline"] = pipeline
    f["signature"] = "|".join([f["check"], pipeline] + f["signature"].split("|")[2:])
    f["expectation"] = "test-only-must-raise"
    f["detail"] = {**f["detail"], "expected": {"type": "ValueError", "regex": "test-only declared error"}}
    p = tmp_path / f"must_raise_{pipeline.replace(':', '_')}.json"
    p.write_text(json.dumps(obj))
    return p


def test_jax_repro_reproduces_a_missing_error(tmp_path):
    src = gen(_must_raise_entry(tmp_path), "jax")
    assert 'jax.config.update(k, v)' in src and "'jax_remat3': True" in src
    assert "jax.checkpoint(fn, **kw)" in src and "symbolic_zeros=True" in src and 'checkpoint_name(' in src
    rc, out = run_script(src, tmp_path)
    assert rc == 1, out
    assert "REPRODUCED [error] jax:remat3 vs expectations" in out and "raised nothing" in out


def test_jax_repro_of_conforming_case_exits_0(tmp_path):
    rc, out = run_script(gen(FIXED, "jax"), tmp_path)
    assert rc == 0, out
    assert "NotImplementedError" in out and "OK: [error] jax:remat3" in out


def test_jax_repro_other_pipeline_jit(tmp_path):
    # The same finding on the jit pipeline: still reproduces, with jit in the script's run.
    src = gen(_must_raise_entry(tmp_path, "jax:remat3:jit"), "jax")
    assert "'jit': True" in src
    rc, out = run_script(src, tmp_path)
    assert rc == 1, out
    assert "REPRODUCED [error] jax:remat3:jit vs expectations" in out


def _torch_finding_entry(tmp_path, check="error", expected=None):
    """The seed program as a torch finding (constructed) to exercise the torch script's checks."""
    obj = json.loads(SEED.read_text())
    f = obj["finding"]
    f.update(pipeline="torch:eager-sac", check=check, reference="expectations" if check == "error" else "policy",
             error_type="none" if check == "error" else "", flags={}, versions={"torch": "2.14.1"})
    f["detail"] = {"expected": expected} if expected else {}
    p = tmp_path / "torch_entry.json"
    p.write_text(json.dumps(obj))
    return p


def test_torch_repros(tmp_path):
    # 1) the JAX finding's program under torch SAC: torch documents no such error, runs clean -> 0
    src = gen(SEED, "torch")
    assert "torch.library.custom_op(\"rc::tag\"" in src and "create_selective_checkpoint_contexts" in src
    assert "torch.autograd.Function" in src and "set_materialize_grads(False)" in src
    # 2) a torch finding whose (constructed) expectation demands an error torch does not raise -> 1
    src2 = gen(_torch_finding_entry(tmp_path, expected={"type": "RuntimeError", "regex": "never"}), "torch")
    # 3) residuals against the policy under SAC with a name policy -> conforms
    src3 = gen(_torch_finding_entry(tmp_path, check="residuals"), "torch")
    rcs = []
    for k, s in enumerate((src, src2, src3)):
        rc, out = run_script(s, tmp_path, f"t{k}.py")
        rcs.append((rc, out))
    assert rcs[0][0] == 0, rcs[0][1]
    assert rcs[1][0] == 1 and "REPRODUCED [error] torch:eager-sac" in rcs[1][1], rcs[1][1]
    assert rcs[2][0] == 0 and "OK: [residuals] torch:eager-sac vs policy" in rcs[2][1], rcs[2][1]


def test_cli_repro_writes_file_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "r.py"
    assert cli_main(["repro", str(SEED), "--out", str(out)]) == 0
    assert out.read_text().startswith("#!/usr/bin/env python3")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "inputs": [], "body": [], "outputs": []}')
    assert cli_main(["repro", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err
    assert cli_main(["repro", str(SEED), "--pipeline", "nope"]) == 2
    assert cli_main(["repro", str(SEED), "--framework", "torch", "--pipeline", "jax:remat3"]) == 2
    err = capsys.readouterr().err
    assert "not a torch pipeline" in err and "Traceback" not in err


def test_pseudo_code_is_readable():
    prog, _, _ = load_program_file(str(SEED))
    code = repro.pseudo_code(prog)
    assert "with checkpoint(policy=nothing_saveable)" in code and "checkpoint_name(x0, 'a')" in code
    assert "custom_vjp(symbolic_zeros=True)" in code


def test_repro_is_inconclusive_exit_3_when_a_side_raises_on_a_value_check(tmp_path):
    """A residuals finding whose program now raises on both sides (constructed: the program of
    an entry the value reference itself rejects) cannot be judged: exit 3, saying why."""
    obj = json.loads((variant_path("error-ref_f64-bfa081b4.json")).read_text())
    f = obj["finding"]
    f.update(check="residuals", pipeline="jax:remat3", reference="jax:remat2", error_type="other", expectation=None,
             signature="residuals|jax:remat3|jax:remat2|other|", detail={})
    p = tmp_path / "inconclusive.json"
    p.write_text(json.dumps(obj))
    rc, out = run_script(gen(p, "jax"), tmp_path)
    assert rc == 3, out
    assert "INCONCLUSIVE" in out and "jax:remat3 raised ValueError" in out and "REPRODUCED" not in out


def test_torch_repro_of_a_real_torch_finding_agrees_with_the_harness(tmp_path):
    """The torch corpus entry (compiled vs eager SAC on nested policies): its standalone script
    exits 1 and prints REPRODUCED exactly when the harness's own replay still fails that key
    (so an upstream fix flips both, and the entry's strict xfail reports it)."""
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.search import replay_pipelines
    from oracles.expectations import Expectations
    from oracles.judge import judge
    path = variant_path("residuals-torch_compile-aot_eager-866d56ae.json")
    prog, inputs, finding = load_program_file(str(path))
    obs = InProcessExecutor().run(prog, inputs, replay_pipelines(finding.key()))
    fails = finding.key() in {v.key() for v in judge(prog, obs, Expectations.load()).failures()}
    rc, out = run_script(gen(path, "torch"), tmp_path)
    assert rc == (1 if fails else 0), out
    assert ("REPRODUCED [residuals] torch:compile-aot_eager vs torch:eager-sac" in out) == fails, out
    if fails:
        assert "named value s0/s1 saved by torch:eager-sac but not by torch:compile-aot_eager" in out, out


def test_jax_repro_of_a_residual_report_finding_checks_the_report(tmp_path):
    # A residual_report finding on a real pipeline: the script compares JAX's report with the
    # closure and conforms (exit 0); with one report row dropped, as a wrong report would be,
    # the same script reproduces (exit 1).
    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import named_chain
    prog = named_chain()
    inputs = input_values(prog, 0)
    v = Verdict(check="residual_report", pipeline="jax:remat3:jit", reference="vjp", status="fail", error_type="count")
    f = make_finding(v, prog, inputs, {}, {}, "cpu")
    src = repro.generate(prog, inputs, f, "jax")
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out
    assert "OK: [residual_report] jax:remat3:jit vs vjp" in out and "named 'a'" in out
    marker = "rows = saved_residuals(lambda *x: objective(*x)[0], *d)"
    assert marker in src
    rc, out = run_script(src.replace(marker, marker + "[:-1]"), tmp_path, name="tampered.py")
    assert rc == 1, out
    assert "REPRODUCED [residual_report] jax:remat3:jit vs vjp" in out and "the report lists" in out
    with pytest.raises(repro.ReproError, match="residual_report"):
        repro.generate(prog, inputs, f, "torch")


def test_jax_repro_of_a_custom_jvp_program_runs_its_rule(tmp_path):
    # A custom_jvp block with a name in its body, under checkpoint: the script builds the block as
    # jax.custom_jvp with its rule, and the residual check conforms (remat2 vs remat2:jit).
    from conformance.engine.findings import make_finding
    from conformance.ir.program import load_program
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import op, prog, region
    blk = {"kind": "custom_jvp", "args": ["x"], "body": [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a")],
           "results": ["n"], "tangents": ["t"], "jvp": [op("cos", ["x"], "c"), op("mul", ["t", "c"], "d")],
           "jvp_results": ["d"]}
    p = prog([region(["x"], [blk, op("tanh", ["n"], "y")], ["y"], {"kind": "save_only_names", "names": ["a"]})])
    inputs = input_values(p, 0)
    v = Verdict(check="residuals", pipeline="jax:remat2:jit", reference="jax:remat2", status="fail", error_type="other")
    src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), "jax")
    assert "jax.custom_jvp(block_" in src and ".defjvp(block_" in src
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out
    assert "OK: [residuals] jax:remat2:jit vs jax:remat2" in out
    assert "with custom_jvp():" in repro.pseudo_code(p) and load_program(p.to_json_obj()) == p


@pytest.mark.parametrize("spelling", ["custom_gradient", "custom_gradient_remat", "defremat"])
def test_jax_repro_spells_the_rule_as_the_program_does(spelling, tmp_path):
    # custom_gradient / custom_gradient(remat=True) / defremat: the script spells the rule so and
    # runs it under custom_vjp3 (the rematerialisation rules need it); the no-remat reference uses
    # the same VJP spelled without a rem rule; gradients agree (exit 0)
    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import op, prog, region
    blk = {"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s")], "results": ["s"], "residuals": ["x"],
           "cts": ["g"], "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")], "bwd_results": ["d"],
           "spelling": spelling}
    p = prog([region(["x"], [blk, op("tanh", ["s"], "y")], ["y"], {"kind": "nothing"})])
    inputs = input_values(p, 0)
    v = Verdict(check="gradient", pipeline="jax:remat3+cvjp3", reference="jax:none", status="fail")
    src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), "jax")
    assert ("jax.custom_gradient(" in src) == spelling.startswith("custom_gradient")
    assert (".defremat(" in src) == (spelling == "defremat")
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out
    assert "OK: [gradient] jax:remat3+cvjp3 vs jax:none" in out
    assert f"spelling={spelling!r}" in repro.pseudo_code(p)


@pytest.mark.parametrize("spelling,tree", [("defvjp", "dict"), ("defvjp", "nested"), ("defremat", "nested")])
def test_jax_repro_passes_residuals_in_the_programs_pytree(spelling, tree, tmp_path):
    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import op, prog, region
    blk = {"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s"), op("cos", ["x"], "k")],
           "results": ["s"], "residuals": ["x", "k"], "cts": ["g"], "bwd": [op("mul", ["g", "k"], "d")],
           "bwd_results": ["d"], "spelling": spelling, "residual_tree": tree}
    p = prog([region(["x"], [blk, op("tanh", ["s"], "y")], ["y"], {"kind": "nothing"})])
    assert "residual_pytree" in p.features()
    inputs = input_values(p, 0)
    v = Verdict(check="gradient", pipeline="jax:remat3+cvjp3", reference="jax:none", status="fail")
    src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), "jax")
    assert f"pack_residuals({tree!r}, res)" in src and f"unpack_residuals({tree!r}, res)" in src
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out
    assert "OK: [gradient] jax:remat3+cvjp3 vs jax:none" in out


def test_jax_repro_of_a_rule_that_branches_on_perturbed(tmp_path):
    # symbolic_zeros fwd marks the perturbed args in its residual pytree, bwd drops the others'
    # cotangents: the script builds that rule, and it conforms on a pipeline pair where it does
    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import op, prog, region
    blk = {"kind": "custom_vjp", "args": ["t", "w"], "fwd": [op("sin", ["t"], "s"), op("mul", ["s", "w"], "m")],
           "results": ["m"], "residuals": ["t", "w", "s"], "cts": ["g"],
           "bwd": [op("cos", ["t"], "c0"), op("mul", ["g", "w"], "gw"), op("mul", ["gw", "c0"], "dt"),
                   op("mul", ["g", "s"], "dw")],
           "bwd_results": ["dt", "dw"], "symbolic_zeros": True, "perturbed_branch": True}
    p = prog([op("tanh", ["x"], "t"), region(["t", "w"], [blk], ["m"], {"kind": "nothing"})],
             inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True},
                     {"id": "w", "shape": [3], "dtype": "float32", "diff": False}], outputs=["m"])
    assert "perturbed_branch" in p.features()
    inputs = input_values(p, 0)
    v = Verdict(check="gradient", pipeline="jax:remat2:jit", reference="jax:none", status="fail")
    src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), "jax")
    assert "mark_perturbed(" in src and "read_perturbed(res, 2)" in src
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out
    assert "OK: [gradient] jax:remat2:jit vs jax:none" in out
    assert "bwd_branches_on_perturbed=True" in repro.pseudo_code(p)


def test_torch_repro_passes_a_static_flag_by_keyword_through_checkpoint(tmp_path):
    """A JAX finding on a region whose static flag is passed by keyword (static_argnames): its
    program under torch SAC passes the keyword through torch.utils.checkpoint and runs clean."""
    path = REG / "remat2-ignores-static-argnames.json"
    src = gen(path, "torch")
    assert "flag=True" in src
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out and "unexpected keyword" not in out, out


@pytest.mark.parametrize("fw", ["jax", "torch"])
def test_repro_of_a_region_with_non_tensor_outputs_returns_and_drops_them(fw, tmp_path):
    """A region whose function returns non-tensor values after its results (extras: None and an int; PyTorch also
    a string, which jax.checkpoint refuses): the script returns them from the region and runs clean."""
    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from generators.programs import input_values
    from tests.programs import op, prog, region
    r = region(["x"], [op("sin", ["x"], "a"), op("cos", ["a"], "y")], ["y"], {"kind": "nothing"})
    r["extras"] = True
    p = prog([r])
    assert "region_non_tensor_outputs" in p.features()
    inputs = input_values(p, 0)
    rival = "jax:remat3" if fw == "jax" else "torch:eager-sac"
    v = Verdict(check="gradient", pipeline=rival, reference="jax:remat2" if fw == "jax" else "torch:none",
                status="fail")
    src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), fw)
    assert ("return (y, None, 3, 'tag')" if fw == "torch" else "return (y, None, 3)") in src.replace("v_", ""), src
    rc, out = run_script(src, tmp_path)
    assert rc == 0 and "error during" not in out, out


def test_a_repro_is_the_same_text_whatever_the_string_hash_seed(tmp_path):
    """MUST_NOT_SAVE was `repr(set(...))`, whose order follows PYTHONHASHSEED: two `report`s of one run
    directory differed (found by tools/soak.py, which compares them). Its items are now written sorted."""
    name = "custom_rule-jax_remat3+cvjp3-f7ffa1f7"   # seven values no policy lets it save
    path = REG / "remat3-cvjp3-fwd-runs-for-unperturbed-args.json"
    code = (f"from conformance import repro\nfrom conformance.engine.loading import load_corpus_variants\n"
            f"_, prog, inputs, f = next(v for v in load_corpus_variants({str(path)!r}) if v[0] == {name!r})\n"
            f"print(repro.generate(prog, inputs, f, 'jax'))\n")
    texts = set()
    for seed in ("0", "1", "2"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONHASHSEED": seed}, cwd=Path(__file__).resolve().parents[1])
        assert r.returncode == 0, r.stderr[-2000:]
        texts.add(r.stdout)
    assert len(texts) == 1
    line = next(x for x in texts.pop().splitlines() if x.startswith("MUST_NOT_SAVE ="))
    items = ast.literal_eval(line.split("=", 1)[1].split("#")[0].strip())
    assert len(items) == 7 and line.startswith("MUST_NOT_SAVE = {" + ", ".join(map(repr, sorted(items))) + "}")


OLD_RELEASE = ("import jax, jax.ad_checkpoint\n"
               "del jax.ad_checkpoint.checkpoint_name_fwd   # as before jax 0.11.2\n"
               "{}\n")


def test_full_jax_repro_runs_on_a_release_without_what_it_does_not_use_and_exits_3_where_it_cannot_run(tmp_path):
    """The full script on an older release: checkpoint_name_fwd missing is no failure for a program without it,
    and a flag that is off and unknown there is not set; an error before the check (here: a flag set to True that
    the release lacks) exits 3, never 1 ("reproduces"). A jax 0.6.2 campaign's script died on the import and
    on `jax.config.update('jax_remat3', False)`, exit status 1."""
    def run(src, patch):
        p = tmp_path / "repro.py"
        p.write_text(src)
        block = OLD_RELEASE.format(patch) + BLOCK
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([sys.executable, "-c", block, str(p)], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=240)
        return r.returncode, r.stdout + r.stderr
    src = gen(FIXED, "jax")   # jax:remat3 raises the documented error: conforms
    assert "'jax_remat3': True" in src and "checkpoint_name_fwd(" not in src
    rc, out = run(src, "")
    assert rc == 0 and "OK: [error] jax:remat3" in out, out
    no_flag = ("_u = jax.config.update\njax.config.update = lambda k, v: (_ for _ in ()).throw(AttributeError(k)) "
               "if k == 'jax_remat3' else _u(k, v)")
    rc, out = run(src, no_flag)   # setting jax_remat3 fails (as where the release lacks it): it cannot run here
    assert rc == 3 and "AttributeError" in out, out


def test_a_repro_runs_the_jax_value_reference_jitted_as_a_campaign_does(monkeypatch):
    """The campaign's ref:f64 runs forward and backward in one jax.jit (outside framework defaults): a repro that
    ran it eagerly would not show a difference only the jitted reference has (jax 0.6.2's conv of a scaled input,
    wrong under jit)."""
    from conformance.pipelines.jax.eager_cache import DEFAULTS_ENV
    from conformance.repro.plan import settings
    monkeypatch.delenv(DEFAULTS_ENV, raising=False)
    assert settings("ref:f64", "jax", None)["jit"] and not settings("jax:none", "jax", None)["jit"]
    monkeypatch.setenv(DEFAULTS_ENV, "1")
    assert not settings("ref:f64", "jax", None)["jit"] and settings("jax:remat2:jit", "jax", None)["jit"]
