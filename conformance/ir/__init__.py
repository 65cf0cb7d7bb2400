"""The program layer: IR nodes and the Program model (nodes, program), the op table (ops), checkpoint
policies (policy), dtypes, type checking (typecheck), features, per-example batching, the
reference interpreter, residual canonicalisation, and the records pipelines and oracles share
(observation, verdict). It imports numpy and pydantic only: nothing above it, no framework."""
