"""The documentation's examples (pytest-codeblocks runs the shell and Python blocks of README.md and docs/) run as
a reader runs them after `source .venv/bin/activate`: this interpreter's scripts (`remat-conformance`, `python`)
first on PATH."""
import os
import sys

os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
