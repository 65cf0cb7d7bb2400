"""Generated code is built, not pasted: hostile strings in every string field of a corpus
entry either get the entry refused (one UsageError naming the field) or reach the repro
script only as literals. The script then parses, contains no call the emitter did not
write, and, run, never executes the injected code."""
import ast
import copy
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.engine.loading import load_program_file
from conformance.errors import UsageError
from conformance.repro import generate
from tests.corpus_files import variant_path

ENTRY = json.loads(variant_path("error-jax_remat3-7d6b302d.json").read_text())
PAYLOAD = "__import__('os').system('touch PWNED')"
PIECES = ['"', "'", '"""', "'''", "\\", "\r", "\n", "\u2028", "\x00", "\ud800", "#", "{", "}", "{{", "x",
          ")", "(", ";", PAYLOAD]
HOSTILE = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


# Every string field of the entry (paths into the JSON object).
FIELDS = [
    ("finding", "error_type"), ("finding", "pipeline"), ("finding", "reference"), ("finding", "check"),
    ("finding", "program_hash"), ("finding", "signature"), ("finding", "device"), ("finding", "expectation"),
    ("finding", "features", 0), ("finding", "versions", "jax"), ("finding", "detail", "expected", "type"),
    ("finding", "detail", "expected", "regex"), ("finding", "detail", "got", "message"),
    ("program", "body", 0, "policy", "names", 0), ("program", "outputs", 0), ("versions", "jax"),
    ("finding", "flags", "jax_remat3"), ("program", "body", 0, "body", 0, "fwd", 0, "params", "name"),
    ("program", "inputs", 0, "dtype"), ("finding", "detail", "expected"),
]


# The fields that take free text (error messages, regexes, names, versions, observations) and so
# accept a hostile string, which must then stay a literal; every other field refuses one.
ACCEPTING = [
    ("finding", "signature"), ("finding", "detail", "expected", "type"), ("finding", "detail", "expected", "regex"),
    ("finding", "detail", "got", "message"), ("program", "body", 0, "policy", "names", 0), ("versions", "jax"),
    ("finding", "detail", "expected"), "observation", "saved", "input id",
]
QUOTE_BREAKING = '"""\'\'\'\\\n' + PAYLOAD + "#{"


def _entry_with(path, value):
    e = copy.deepcopy(ENTRY)
    e["finding"]["detail"]["observations"] = {"jax:remat3": {"error": "x", "saved": ["v1:float32[]"]}}
    e["finding"]["detail"]["got"] = {"type": "X", "message": "m", "stage": "forward"}
    if path == "observation":
        e["finding"]["detail"]["observations"]["jax:remat3"]["error"] = value
    elif path == "saved":
        e["finding"]["detail"]["observations"]["jax:remat3"]["saved"] = [value]
    elif path == "input id":   # an input id, renamed everywhere it is used
        old = e["program"]["inputs"][1]["id"]
        e["program"]["inputs"][1]["id"] = value
        e["inputs"][value] = e["inputs"].pop(old)
    else:
        _set(e, path, value)
    return e


class _Blank(ast.NodeTransformer):
    def visit_Constant(self, node):
        return ast.Constant("") if isinstance(node.value, str) else node


def _calls(src: str) -> set[str]:
    """What the script calls, with string literals blanked (their content is data)."""
    tree = _Blank().visit(ast.parse(src))
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}




def _load(tmp_path, obj):
    p = tmp_path / "entry.json"
    p.write_text(json.dumps(obj))
    return load_program_file(str(p))


@pytest.fixture(scope="module")
def clean_calls(tmp_path_factory):
    prog, inputs, finding = _load(tmp_path_factory.mktemp("clean"), _entry_with(("finding", "device"), "cpu"))
    return {fw: _calls(generate(prog, inputs, finding, fw)) for fw in ("jax", "torch")}


@pytest.mark.parametrize("field", FIELDS + ["observation", "saved", "input id"], ids=str)
@settings(max_examples=15)
@given(value=HOSTILE)
def test_hostile_strings_are_refused_or_stay_literals(tmp_path_factory, clean_calls, field, value):
    try:
        prog, inputs, finding = _load(tmp_path_factory.mktemp("h"), _entry_with(field, value))
    except UsageError as e:
        assert str(e).startswith(str(tmp_path_factory.getbasetemp())) and "\n" not in str(e), str(e)
        return
    for fw in ("jax", "torch"):
        src = generate(prog, inputs, finding, fw)
        assert _calls(src) <= clean_calls[fw], _calls(src) - clean_calls[fw]


@pytest.mark.parametrize("field", FIELDS + ["observation", "saved", "input id"], ids=str)
def test_free_text_fields_take_a_quote_breaking_payload_as_a_literal(tmp_path, clean_calls, field):
    """The path the property above must not skip: each free-text field accepts the payload (and
    its repro stays literal), each other field refuses it, naming the field."""
    try:
        prog, inputs, finding = _load(tmp_path, _entry_with(field, QUOTE_BREAKING))
    except UsageError as e:
        assert field not in ACCEPTING, f"{field} refused a free-text value: {e}"
        assert str(e).startswith(str(tmp_path)) and "\n" not in str(e), str(e)
        return
    assert field in ACCEPTING, f"{field} accepted {QUOTE_BREAKING!r}"
    for fw in ("jax", "torch"):
        src = generate(prog, inputs, finding, fw)
        ast.parse(src)
        assert _calls(src) <= clean_calls[fw], _calls(src) - clean_calls[fw]


def test_an_injected_payload_never_runs(tmp_path):
    """One entry carrying the payload, quote-breaking, in every field the loader accepts."""
    e = _entry_with("observation", f'"""\n{PAYLOAD}\n#')
    e["finding"]["detail"]["expected"]["regex"] = f"'\"\"\"{PAYLOAD}"
    e["finding"]["detail"]["got"]["message"] = f"\r{PAYLOAD}"
    e["program"]["body"][0]["policy"]["names"][0] = f"a')]); {PAYLOAD}; (['"
    prog, inputs, finding = _load(tmp_path, e)
    for fw in ("jax", "torch"):
        script = tmp_path / f"repro_{fw}.py"
        script.write_text(generate(prog, inputs, finding, fw))
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert not (tmp_path / "PWNED").exists(), fw
        # the script ran to its verdict (the finding is jax:remat3's: it reproduces there, printing
        # the injected text as data; it does not reproduce on torch)
        want = (1, "\nREPRODUCED [error] jax:remat3") if fw == "jax" else (0, "\nOK: [error] torch:eager-sac")
        assert r.returncode == want[0] and want[1] in r.stdout, (fw, r.returncode, r.stdout[-1500:], r.stderr[-1500:])
        assert fw == "torch" or PAYLOAD in r.stdout
