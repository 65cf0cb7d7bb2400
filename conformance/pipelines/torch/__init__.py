"""The PyTorch pipelines (eager selective activation checkpointing, torch.compile), their lowering
table, graph capture and compile settings. Imports torch, conformance.ir and conformance.pipelines."""
