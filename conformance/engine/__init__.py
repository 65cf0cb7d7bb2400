"""The campaign engine: findings and their roots (findings, roots), loading and storing programs
and runs (loading, store), the search that generates, judges, shrinks and dedups (search,
reduce), the campaign loop and its parallel workers (campaign, parallel, runner), isolated
execution (isolation), run options and the nightly matrix plan (options, matrix). It may import
conformance.ir, conformance.pipelines, generators and oracles; never reporting, repro or cli."""
