"""The commands: one module per command (main parses and dispatches; report, repro, recheck,
devices, matrix; progress prints), and the pytest plugin. The top layer: it may import
everything below it; nothing imports it."""
