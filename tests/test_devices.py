"""The CPU-vs-device oracle (oracles/devices.py) and `remat-conformance devices`: each part of the
oracle can fail; the command's plumbing agrees with itself on the CPU and writes a run directory
that `report` merges; on a CUDA device (marked gpu) the real comparison runs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engine.runner import InProcessExecutor
from conformance.ir.nodes import Checkpoint, Input, Op
from conformance.ir.observation import ErrorInfo
from conformance.ir.policy import SaveOnlyNames
from conformance.ir.program import Program, validate
from conformance.ir.verdict import DEVICE_REFERENCE
from generators.programs import input_values
from oracles.devices import compare_devices

ROOT = Path(__file__).resolve().parents[1]


def _program():
    body = [
        Checkpoint(
            args=["x"],
            body=[
                Op(op="sin", args=["x"], out="a"),
                Op(op="name", args=["a"], params={"name": "n"}, out="b"),
                Op(op="cos", args=["b"], out="c"),
            ],
            results=["c"],
            policy=SaveOnlyNames(names=["n"]),
        )
    ]
    return validate(Program(inputs=[Input(id="x", shape=[3], dtype="float32")], body=body, outputs=["c"]))


@pytest.mark.parametrize("name", ["jax:remat3", "torch:eager-sac"])
def test_each_part_of_the_device_oracle_can_fail(name):
    prog = _program()
    obs = InProcessExecutor("cpu").run(prog, input_values(prog, 0), [name])[name]
    assert obs.error is None and obs.residuals
    same = compare_devices(prog, name, obs, obs.model_copy(deep=True))
    assert {v.check: v.status for v in same} == {"gradient": "pass", "residuals": "pass"}
    assert all(v.reference == DEVICE_REFERENCE for v in same)
    # a gradient off by far more than rounding
    dev = obs.model_copy(deep=True)
    dev.grads = {k: [x + 0.5 for x in v] for k, v in dev.grads.items()}
    assert {v.check: v.status for v in compare_devices(prog, name, obs, dev)}["gradient"] == "fail"
    # a residual the device run does not save
    dev = obs.model_copy(deep=True)
    dev.residuals = dev.residuals[1:]
    r = next(v for v in compare_devices(prog, name, obs, dev) if v.check == "residuals")
    assert r.status == "fail" and r.error_type == "missing" and r.detail["missing"]
    # an error on one device only: status equivalence; on both: equal status
    dev = obs.model_copy(deep=True)
    dev.error = ErrorInfo(type="RuntimeError", message="boom", stage="backward")
    v = compare_devices(prog, name, obs, dev)
    assert [(x.check, x.status, x.error_type) for x in v] == [("error", "fail", "RuntimeError")]
    both = obs.model_copy(deep=True)
    both.error = dev.error
    assert [(x.check, x.status) for x in compare_devices(prog, name, both, dev)] == [("error", "pass")]


def test_the_devices_command_agrees_with_itself_on_the_cpu_and_reports(tmp_path):
    out = tmp_path / "dev"
    r = subprocess.run([sys.executable, "-m", "conformance.cli", "devices", "--pipelines", "jax:remat3,torch:eager-sac",
                        "--device", "cpu", "--max-examples", "5", "--seed", "3", "--out", str(out), "--strict"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "compared 5 programs on cpu and cpu" in r.stdout and "0 disagreement(s)" in r.stdout
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(x["status"] == "pass" for x in recs)
    assert all(any(v[2] == DEVICE_REFERENCE and v[3] == "pass" for v in x["verdicts"]) for x in recs)
    rep = subprocess.run([sys.executable, "-m", "conformance.cli", "report", str(out), "--out", str(tmp_path / "rep")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0 and "5 programs, 0 findings" in rep.stdout, rep.stdout + rep.stderr


def test_no_cuda_device_is_a_clear_error(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: test_cuda_cell_agrees_with_the_cpu runs instead")
    r = subprocess.run([sys.executable, "-m", "conformance.cli", "devices", "--pipelines", "torch:eager-sac",
                        "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "--device cuda: no CUDA device here" in r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
def test_cuda_cell_agrees_with_the_cpu(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "dev"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance.cli",
            "devices",
            "--pipelines",
            "jax:remat3,jax:remat3:jit,torch:eager-sac,torch:compile-inductor",
            "--device",
            "cuda",
            "--max-examples",
            "20",
            "--strict",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]   # --strict: a disagreement exits 1
    assert "compared 20 programs on cuda and cpu" in r.stdout and "0 disagreement(s)" in r.stdout, r.stdout
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 20 and all(any(v[2] == DEVICE_REFERENCE for v in x["verdicts"]) for x in recs)
