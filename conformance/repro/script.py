"""The standalone script: a plan, the program's source in one dialect, rendered into the
dialect's template with the exact inputs and every pipeline's settings."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from conformance import __version__
from conformance.ir.dtypes import DTYPES
from conformance.ir.interpreter import output_cotangents
from conformance.ir.nodes import CustomVJP, checkpoint_name_of, primal_ops, walk
from conformance.pipelines import registry
from conformance.pipelines.jax import table as jax_table
from conformance.pipelines.torch import table as torch_table
from conformance.repro.emit_jax import JaxEmitter
from conformance.repro.emit_torch import TorchEmitter
from conformance.repro.plan import must_not_save, plan, seen, settings, summary
from generators.programs import input_values
from oracles.gradients import tolerance

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
EMITTERS = {"jax": JaxEmitter, "torch": TorchEmitter}
# Docstrings and comments hold only text the harness wrote, in this character set; every value
# from an input file reaches the script as a literal (repr of plain data, or JSON).
_DOC_TEXT = re.compile(r"[^A-Za-z0-9 _.,:;/()\[\]{}+=<>'|*#!?%&@^~\n-]")
_FILENAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def doc_text(text: str) -> str:
    """Text safe inside a triple-quoted docstring or a comment: outside characters become '?'."""
    return _DOC_TEXT.sub("?", text)


def _fmt_array(a: np.ndarray) -> str:
    """An input as numpy source; bfloat16 (not a numpy dtype) as float32, which holds it exactly."""
    data = a.astype(np.float64).tolist()
    dtype = "float32" if str(a.dtype) == "bfloat16" else str(a.dtype)
    return f"np.array({json.dumps(data)}, dtype=np.{dtype})" if a.ndim else f"np.array({float(a)!r}, dtype=np.{dtype})"


def _set_literal(items) -> str:
    """A set's source with its items sorted: `repr` of a set of strings follows the process's string hash
    (PYTHONHASHSEED), so two builds of one report would differ."""
    items = sorted(set(items))
    return "{" + ", ".join(map(repr, items)) + "}" if items else "set()"


def _dialect(framework: str, prog) -> dict:
    """What the template of one framework needs from its lowering table."""
    if framework == "jax":
        return {"prelude": jax_table.PRELUDE.strip()}
    return {"prelude": torch_table.PRELUDE.strip(), "kinds_of": torch_table.kinds_of_source(),
            "tag_packet": torch_table.TAG_PACKET}


def generate(prog, inputs: dict[str, np.ndarray] | None, finding=None, framework: str = "jax",
             pipeline: str | None = None, filename: str = "repro.py") -> str:
    """The standalone reproducer's source."""
    import jinja2
    if inputs is None:
        inputs = input_values(prog, 0)
    pl = plan(prog, finding, framework, pipeline)
    e = EMITTERS[framework](prog)
    defs, body = e.program()
    names = {i: checkpoint_name_of(s) for i, s in primal_ops(prog).items() if checkpoint_name_of(s)}
    rtol, atol = tolerance(prog, "tight" if registry.role_of(pl.reference) == registry.BASELINE else "loose")
    run_settings = {p: settings(p, framework, finding) for p in pl.run}
    seen_versions, seen_lines = seen(finding, framework)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template(f"repro_{framework}.py.j2").render(
        harness=__version__, summary=doc_text(summary(finding, pl, framework)),
        filename=filename if _FILENAME.match(filename) else "repro.py",
        check=pl.check, pipeline=pl.pipeline, reference=pl.reference, run=pl.run,
        settings="{\n" + "".join(f"    {json.dumps(p)}: {s!r},\n" for p, s in run_settings.items()) + "}",
        value_ref=registry.value_reference(),
        rtol=repr(rtol), atol=repr(atol), expect_raises=repr(pl.expect_raises), expect_why=pl.expect_why,
        timeout=300 if pl.check != "timeout" else 120, names=repr(names),
        must_not_save=_set_literal(must_not_save(prog)),
        seen=repr({"versions": seen_versions, "observed": seen_lines}),
        inputs=[(k, _fmt_array(np.asarray(inputs[k]))) for k in [i.id for i in prog.inputs]],
        diff_ids=[e.n[i.id] for i in prog.diff_inputs()], diff_keys=[i.id for i in prog.diff_inputs()],
        defs=defs, body=body, values_body=e.values(), order2=prog.diff.order == 2, diff_mode=prog.diff.mode,
        cotangents=repr(output_cotangents(prog)), aux=prog.diff.aux, batch=prog.diff.batch,
        batched=repr(sorted(i.id for i in prog.inputs if i.batched)),
        input_dtypes=repr({i.id: i.dtype for i in prog.inputs}),
        match_tol=repr({k: d.match_tol for k, d in DTYPES.items()}), has_names=bool(names),
        blocks=[p for s, _, p, _ in walk(prog.body) if isinstance(s, CustomVJP)],
        sharded=any(s.get("shard_map") or s.get("sharded") for s in run_settings.values()),
        devices=registry.SHARD_MAP_DEVICES,
        **_dialect(framework, prog))
