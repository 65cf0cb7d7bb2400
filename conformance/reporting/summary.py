"""summary.md: the report of a campaign's one run (the same aggregation and the same Markdown
renderer as report.md), headed by what only the campaign knows of itself."""
from __future__ import annotations

import time

from conformance import __version__
from conformance.engine.options import RecordedOptions
from conformance.reporting.build import build
from conformance.reporting.inputs import RunData, RunInfo
from conformance.reporting.render import link_issues, render_md


def campaign_run(camp, run_info: dict) -> RunData:
    """The campaign as the report reads a run directory: what summary.md is built from, and what its
    issue texts are refreshed from (conformance.reporting.refresh) at the campaign's end."""
    info = RunInfo(schema_version=1, harness=run_info.get("harness", __version__),
                   options=RecordedOptions.model_validate(camp.opts.recorded()),
                   versions=run_info.get("versions") or {},
                   started=run_info.get("started") or time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return RunData(camp.store.dir, info, findings=list(camp.findings), tally=camp.tally)


def summary_markdown(camp, run_info: dict) -> str:
    """`camp`: a finished or interrupted conformance.engine.campaign.Campaign; `run_info`: its run.json."""
    rep = build([campaign_run(camp, run_info)], with_repro=False, expectations=camp.expectations)
    link_issues(rep, camp.store.dir)   # summary.md sits in the run directory, beside corpus/
    rep["campaign"] = camp.facts()
    return render_md(rep)
