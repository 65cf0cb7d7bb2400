"""Malformed input never gets past the loaders as anything but the documented error.

Valid generated programs are mutated (fields dropped or renamed, wrong types, huge shapes, deep
nesting, unknown ops and policies, long names, NaN, wrong ids) and fed to
`conformance.ir.program.load_program` (accepts, or raises ProgramError naming a field),
`conformance.cli.load_program_file` (accepts, or raises UsageError starting with the file's path)
and the results reader (`store.read_jsonl`, then `Campaign.restore`: accepts, or StoreError
naming the file and line). Anything else (KeyError, TypeError, RecursionError...) is a bug.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.cli.main import UsageError, load_program_file
from conformance.engine.store import StoreError, read_jsonl
from conformance.ir.nodes import ProgramError
from conformance.ir.program import Program, load_program
from generators.programs import Config, cases

REPO = Path(__file__).resolve().parents[1]
SMALL = Config(max_stmts=3, max_depth=2)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                derandomize=True)

# -- mutations ------------------------------------------------------------------------------
class _Long(str):
    def __repr__(self):
        return "'n' * 5000"


LONG = _Long("n" * 5000)
WRONG_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.just(float("nan")), st.just(float("inf")),
    st.floats(allow_nan=True), st.text(max_size=8), st.just(LONG), st.just([]), st.just({}),
    st.just([2**40, 2**40]), st.just([-1]), st.just([0]), st.just(["x", 1]), st.just([[1, 2], "a"]),
    st.just({"kind": "frobnicate"}), st.just({"kind": "op", "op": "nope", "args": [], "out": "z"}),
    st.just({"kind": "checkpoint"}), st.just({"kind": "names", "names": [LONG]}),
    st.just("😀\x00\ud7ff"), st.lists(st.integers(-3, 5), max_size=4),
)
SPECIAL = {   # key -> values that target that field
    "op": st.sampled_from(["frobnicate", "", "name", "matmul", "nondiff_scale", LONG]),
    "kind": st.sampled_from(["op", "checkpoint", "custom_vjp", "scan", "", None]),
    "dtype": st.sampled_from(["float16", "int32", "bfloat16", "", None]),
    "shape": st.sampled_from([[2**40], [10**6, 10**6], [], [0], [-3], [1, 1, 1, 1, 1, 1, 1, 1, 1], "3", [1.5]]),
    "policy": st.sampled_from([{"kind": "frobnicate"}, {"kind": "save_only_names", "names": []},
                               {"kind": "save_only_names", "names": [LONG]}, "everything", None,
                               {"kind": "everything", "extra": 1}, {"kind": "both", "a": {}, "b": {}}]),
    "args": st.sampled_from([["ghost"], [], ["x0", "x0", "x0"], [None], "x0", [LONG]]),
    "out": st.sampled_from(["x0", "", LONG, None, 7]),
    # {"perm": [0, "a"]} and {"perm": [0.0, 1]} are left out while ir._infer raises TypeError on them
    # (see test_transpose_perm_of_wrong_types_is_a_program_error below).
    "params": st.sampled_from([{"perm": [[0], [1]]}, {"perm": [1]}, {"shape": [2**62, 2**62]},
                               {"axis": True}, {"axis": 99}, {"c": float("nan")}, {"c": "1"},
                               {"name": "not an identifier"}, {"name": LONG}, {"index": -1}, {}]),
    "schema_version": st.sampled_from([0, 2, "1", None, 1.0, True]),
    "outputs": st.sampled_from([[], ["ghost"], [None], "v1"]),
    "nondiff": st.sampled_from([[float("nan")], ["a"], [float("inf")], [1e308, -1e308]]),
    "order": st.sampled_from([0, 3, "2", None]),
}


def _positions(obj, depth=0):
    """Every (container, key) in a JSON tree (down to 40 levels)."""
    if depth > 40:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield obj, k
            yield from _positions(v, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield obj, i
            yield from _positions(v, depth + 1)


def _deep(depth):
    v = 0
    for _ in range(depth):
        v = [v]
    return v


@st.composite
def mutated_programs(draw):
    prog, _ = draw(cases(SMALL))
    obj = prog.to_json_obj()
    for _ in range(draw(st.integers(0, 3), label="mutations")):   # 0: the valid program itself
        pos = list(_positions(obj))
        if not pos:
            break
        parent, key = draw(st.sampled_from(pos), label="where")
        how = draw(st.sampled_from(["drop", "rename", "wrong", "special", "deep", "dup", "wrong_id", "op_params"]),
                   label="how")
        ops = [c for c, k in pos if isinstance(c, dict) and c.get("kind") == "op" and k == "params"]
        if how == "op_params" and ops:
            draw(st.sampled_from(ops), label="op")["params"] = draw(SPECIAL["params"])
        elif how == "drop":
            del parent[key]
        elif how == "rename" and isinstance(parent, dict):
            parent[key + "_x" if draw(st.booleans()) else key.upper()] = parent.pop(key)
        elif how == "special" and isinstance(key, str) and key in SPECIAL:
            parent[key] = draw(SPECIAL[key])
        elif how == "deep":
            parent[key] = _deep(draw(st.sampled_from([50, 5000])))
        elif how == "dup" and isinstance(parent, list):
            parent.append(parent[key])
        elif how == "wrong_id" and isinstance(parent[key], str):
            parent[key] = draw(st.sampled_from(["ghost", "x0", "v1", "", parent[key] + "'"]))
        else:
            parent[key] = draw(WRONG_VALUES)
    return obj


ROOTS = st.one_of(mutated_programs(), mutated_programs(),
                  WRONG_VALUES, st.builds(lambda d: {"schema_version": 1, "body": d}, WRONG_VALUES))


def _check_program_error(e: ProgramError):
    assert isinstance(e.field, str) and e.field, e
    assert isinstance(e.reason, str) and e.reason, e


# -- the loaders ----------------------------------------------------------------------------
def _both_paths(prop, counts: Counter) -> None:
    """Run a derandomised property and assert that its examples took both paths, accept and
    reject: a fuzzer whose inputs all fail one way tests half of what it claims."""
    prop()
    assert counts["accepted"] > 0 and counts["rejected"] > 0, dict(counts)


def test_load_program_accepts_or_raises_program_error():
    STATS = Counter()
    _both_paths(given(obj=ROOTS)(FUZZ(lambda obj: _prop_load_program(obj, STATS))), STATS)


def _prop_load_program(obj, STATS):
    STATS["programs"] += 1
    try:
        p = load_program(obj)
    except ProgramError as e:
        STATS["rejected"] += 1
        _check_program_error(e)
    else:
        STATS["accepted"] += 1
        assert isinstance(p, Program)
        assert load_program(json.loads(p.to_json())) == p


def test_load_program_file_accepts_or_raises_usage_error(tmp_path_factory):
    STATS = Counter()
    prop = given(obj=ROOTS, wrap=st.sampled_from(["bare", "corpus", "corpus_bad_inputs"]),
                 damage=st.sampled_from(["none", "none", "truncate", "bytes", "nan_text", "empty"]))(
        FUZZ(lambda obj, wrap, damage: _prop_load_program_file(tmp_path_factory, obj, wrap, damage, STATS)))
    _both_paths(prop, STATS)


def _prop_load_program_file(tmp_path_factory, obj, wrap, damage, STATS):
    STATS["files"] += 1
    d = tmp_path_factory.mktemp("fuzz")
    path = str(d / "bad.json")
    if wrap != "bare":
        inputs = {"x0": {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}}
        if wrap == "corpus_bad_inputs":
            inputs = {"x0": {"dtype": "float32", "shape": "2", "data": None}, "zz": 1}
        obj = {"program": obj, "inputs": inputs}
    try:
        text = json.dumps(obj)
    except (ValueError, RecursionError):
        text = "[" * 100000
    data = text.encode()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "bytes":
        data = data[:10] + b"\xff\xfe\x00" + data[10:]
    elif damage == "nan_text":
        data = data.replace(b"1", b"NaN", 1)
    elif damage == "empty":
        data = b""
    with open(path, "wb") as f:
        f.write(data)
    try:
        load_program_file(path)
    except UsageError as e:
        STATS["rejected"] += 1
        msg = str(e)
        assert msg.startswith(f"{path}: "), msg
        assert "Traceback" not in msg
    else:
        STATS["accepted"] += 1


# -- the results reader ---------------------------------------------------------------------
def _valid_record(seq, h="0123456789abcdef"):
    return {"type": "result", "schema_version": 1, "seq": seq, "round": 0, "hash": h, "seed": seq,
            "size": 1, "features": ["float32"], "status": "pass",
            "verdicts": [["gradient", "jax:remat3", "ref:f64", "pass", ""]], "known_signatures": [],
            "new": [], "expectations": {}, "t": 0.5 * seq, "errors": {}}


RECORD_FIELDS = list(_valid_record(0))


def test_results_reader_accepts_or_raises_store_error(tmp_path_factory):
    STATS = Counter()
    prop = given(n=st.integers(0, 5),
                 edits=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(RECORD_FIELDS), WRONG_VALUES,
                                          st.sampled_from(["set", "drop"])), max_size=3),
                 tail=st.sampled_from(["clean", "torn", "no_newline", "garbage_mid", "non_object", "finding",
                                       "bad_finding"]))(
        FUZZ(lambda n, edits, tail: _prop_results_reader(tmp_path_factory, n, edits, tail, STATS)))
    _both_paths(prop, STATS)


def _prop_results_reader(tmp_path_factory, n, edits, tail, STATS):
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from conformance.engine.store import Store
    STATS["results"] += 1
    d = tmp_path_factory.mktemp("res")
    recs = [_valid_record(i, f"{i:016x}") for i in range(n)]
    for i, fld, val, op in edits:
        if i < len(recs):
            if op == "drop":
                recs[i].pop(fld, None)
            else:
                recs[i][fld] = val
    lines = [json.dumps(r).encode() for r in recs]
    if tail == "garbage_mid":
        lines.insert(len(lines) // 2, b"\x00{not json")
    elif tail == "non_object":
        lines.append(b"[1, 2, 3]")
    elif tail == "finding":
        lines.append(json.dumps({"type": "finding", "signature": "crash|x|y|-|float32", "t": 1.0}).encode())
    elif tail == "bad_finding":
        lines.append(json.dumps({"type": "finding", "signature": 3}).encode())
    data = b"\n".join(lines) + (b"\n" if lines else b"")
    if tail == "torn":
        data += json.dumps(_valid_record(99)).encode()[:37]
    elif tail == "no_newline" and data:
        data = data[:-1]
    path = d / "results.jsonl"
    path.write_bytes(data)
    try:
        got, warn = read_jsonl(path)
    except StoreError as e:
        STATS["rejected"] += 1
        assert str(e).startswith(f"{path}: line "), e
        return
    STATS["accepted"] += 1
    if tail == "torn":
        assert warn and "torn last line" in warn
    # whatever the reader accepts, resuming from it must work
    (d / "run.json").write_text("{}")
    camp = Campaign(Options(pipelines=["ref:f64"]), Store(d, resume=True), executor=None, expectations=None)
    camp.restore(got, [])
    assert camp.checked <= len(got)


@pytest.mark.parametrize("perm", [[0, "a"], [0.0, 1], [True, False]])
def test_transpose_perm_of_wrong_types_is_a_program_error(perm):
    obj = {"schema_version": 1, "inputs": [{"id": "x0", "shape": [2, 3], "dtype": "float32"}],
           "body": [{"kind": "op", "op": "transpose", "args": ["x0"], "params": {"perm": perm}, "out": "y"}],
           "outputs": ["y"]}
    with pytest.raises(ProgramError) as e:
        load_program(obj)
    assert e.value.field == "body[0].params.perm"


# -- the CLI --------------------------------------------------------------------------------
@pytest.mark.parametrize("content, field", [
    ('{"schema_version": 1, "inputs": [{"id": "x0", "shape": [2], "dtype": "int32"}], "body": [], '
     '"outputs": ["x0"]}', "inputs[0].dtype"),
    ('{"schema_version": 1, "inputs": [{"id": "x0", "shape": [2], "dtype": "float32"}], "body": '
     '[{"kind": "op", "op": "frobnicate", "args": ["x0"], "out": "y"}], "outputs": ["y"]}', "body[0].op"),
    ('{"schema_version": 9}', "schema_version"),
    ('{"schema_version": 1, "inputs": [', "line 1 column"),
])
def test_replay_bad_file_exits_2_with_a_one_line_error(tmp_path, content, field):
    f = tmp_path / "bad.json"
    f.write_text(content)
    r = subprocess.run([sys.executable, "-m", "conformance.cli", "replay", "bad.json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: bad.json: {field}"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_resume_with_a_damaged_results_file_is_a_usage_error(tmp_path, capsys):
    from conformance.cli import main as cli
    run = json.dumps({"schema_version": 1, "options": {}})
    (tmp_path / "run.json").write_text(run)
    (tmp_path / "results.jsonl").write_text(
        '{"type": "result"}\n{"type": "result", "hash": "a", "seed": 1, "seq": 0}\n'
    )
    rc = cli.main(["run", "--resume", "--out", str(tmp_path), "--no-isolate", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{tmp_path}/results.jsonl: line 1: hash" in err, err
    assert "Traceback" not in err
    assert (tmp_path / "run.json").read_text() == run   # validated before anything is written
