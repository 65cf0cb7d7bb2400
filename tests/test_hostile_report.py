"""Markup is escaped: hostile strings in every field the report shows (run.json, results
verdicts, findings) come out as text in report.html, in element content and in attributes,
and in a real browser no injected script runs."""
import json
import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.reporting import render
from conformance.reporting.build import build
from conformance.reporting.inputs import load_run
from tests.test_browser import FIX, _run

PAYLOADS = ['<script>document.body.setAttribute("data-pwned","1")</script>',
            '"><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'1\')">',
            "'><svg onload=document.body.setAttribute('data-pwned','1')>"]
RAW = re.compile(r"<script>document|<img src=x|<svg onload", re.I)


def hostile_run(tmp_path, payload):
    d = tmp_path / "run"
    shutil.copytree(FIX / "run_a", d)
    run = json.loads((d / "run.json").read_text())
    run["harness"] = payload
    run["started"] = payload
    run["versions"]["jax"] = payload
    run["options"]["pipelines"].append(payload)
    (d / "run.json").write_text(json.dumps(run))
    recs = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    for r in recs:
        if r["type"] == "result":
            r["verdicts"].append(["gradient", payload, payload, "fail", payload])
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    fs = json.loads((d / "findings.json").read_text())
    for f in fs:
        f["error_type"] = payload
        f["features"] = f["features"] + [payload]
        f["versions"] = {**f["versions"], "jax": payload}
        f["flags"] = {payload: payload}
        f["title"] = payload   # the behaviour's title, its class's reason and links, its variants
        f["triage"] = {"class": "bug", "reason": payload, "links": [payload], "confirmed": False}
        f["variants"] = {"labels": {payload: {"count": 2}}, payload: {payload: {"count": 1}}}
        f["detail"] = {**f["detail"], "note": payload,
                       "observations": {payload: {"error": payload, "saved": [payload], "grads": {payload: 1.0}}}}
    (d / "findings.json").write_text(json.dumps(fs))
    return d


@pytest.mark.parametrize("payload", PAYLOADS)
def test_hostile_fields_are_escaped_in_html(tmp_path, payload):
    rep = build([load_run(hostile_run(tmp_path, payload))], [], with_repro=True)
    html = render.render_html(rep, {})
    assert not RAW.search(html), RAW.search(html)
    assert "&lt;" in html   # the payload is there, as text


# marked, so that a verbatim occurrence can only be the payload; always with a character HTML gives
# meaning to
MARKUP = st.tuples(
    st.lists(st.sampled_from(["<", ">", "&", '"', "'", "</pre>", "<script>", "javascript:", "x", "\u2028",
                              "{{", "}}", "&amp;", "-->", "<!--"]), max_size=5),
    st.sampled_from(["<", ">", "&", '"', "'"]),
).map(lambda t: "QX" + "".join(t[0]) + t[1] + "QX")


@settings(max_examples=15, deadline=None)
@given(payload=MARKUP)
def test_arbitrary_markup_never_appears_raw(tmp_path_factory, payload):
    """Any string with a character HTML gives meaning to is written escaped, wherever it is shown."""
    d = tmp_path_factory.mktemp("m")
    html = render.render_html(build([load_run(hostile_run(d, payload))], [], with_repro=False), {})
    assert payload not in html
    assert html.count("QX") >= 2   # the payload is shown, escaped


@pytest.mark.browser
def test_no_injected_script_runs_in_a_browser(tmp_path):
    out = tmp_path / "rep"
    runs = [load_run(hostile_run(tmp_path / str(k), p)) for k, p in enumerate(PAYLOADS)]
    render.write(build(runs, [], with_repro=True), out)
    r = _run(["--dump-dom", (out / "report.html").as_uri()], tmp_path)
    assert 'data-ready="1"' in r.stdout, r.stderr[-2000:]   # the page's own script ran
    assert 'data-pwned="1"' not in r.stdout
