"""The run options are declared once (conformance.engine.options.Options): the parser's flags and
defaults, run.json, its validation and the resume check all come from that model."""
from __future__ import annotations

import argparse

import pytest

from conformance.cli.main import build_parser
from conformance.engine.options import Options, _flag, options_from_args


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_every_flagged_field_is_a_run_flag_with_the_models_default():
    parser = _run_parser()
    dests = {a.dest: a for a in parser._actions}
    flagged = [k for k in Options.model_fields if _flag(k) is not None]
    assert set(flagged) <= set(dests)
    args = parser.parse_args([])
    opts = options_from_args(args, pipelines=["jax:remat3"], jobs=1)
    for k in flagged:
        f = _flag(k)
        if not (f.unset or k in ("pipelines", "jobs")):
            assert getattr(opts, k) == Options.model_fields[k].get_default(call_default_factory=True), k
    assert opts.shrink_seconds == Options().shrink_seconds and opts.max_examples == Options().max_examples


def test_flags_parse_into_the_model_and_run_json_records_and_validates_it():
    args = _run_parser().parse_args(["--budget", "7", "--shard", "1/3", "--share", "torch:compile=0.5",
                                     "--require", "scan", "--require", "cond", "--max-stmts", "3"])
    opts = options_from_args(args, pipelines=["jax:remat3"], jobs=2)
    assert (opts.budget, opts.shard, opts.shares, opts.require) == (7.0, (1, 3), {"torch:compile": 0.5},
                                                                    ["cond", "scan"])
    assert opts.config.max_stmts == 3 and opts.config.require == ("cond", "scan")
    rec = opts.recorded()
    assert {"budget", "shard", "shares", "require", "max_stmts", "pipelines", "seed"} <= set(rec)
    assert not {"out", "resume", "quiet", "timeout", "isolate", "generator", "stop_when"} & set(rec)
    again = Options.from_record(rec, "run.json")
    assert again.recorded() == rec and not opts.resume_conflicts(again)


def test_a_resumed_run_must_keep_the_resume_fields_and_a_bad_record_names_the_field():
    opts = Options(pipelines=["jax:remat3"], seed=1, budget=10)
    assert opts.resume_conflicts(Options(pipelines=["jax:remat3"], seed=1, budget=99)) == []
    assert opts.resume_conflicts(Options(pipelines=["jax:remat3"], seed=2)) == ["seed"]
    # a run written before an option existed had its default
    assert Options.from_record({"pipelines": ["jax:remat3"], "seed": 1}, "run.json").round_size == 40
    with pytest.raises(ValueError, match=r"out/run.json: options.shard"):
        Options.from_record({"shard": "x"}, "out/run.json")
    with pytest.raises(ValueError):
        Options(pipelines=[], budgett=1)   # a misspelt option is refused
