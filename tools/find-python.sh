#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 interpreter that actually runs.
# Order: $PYTHON, interpreters on PATH, then pyenv's installed versions.
set -u
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
if [ -n "${PYTHON:-}" ]; then
  if ok "$PYTHON"; then command -v "$PYTHON" || echo "$PYTHON"; exit 0; fi
  echo "error: PYTHON=$PYTHON does not run or is older than 3.12" >&2; exit 1
fi
for c in python3.12 python3.13 python3.14 python3 python; do
  p=$(command -v "$c" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V); do
  if ok "$p"; then echo "$p"; exit 0; fi
done
cat >&2 <<'MSG'
error: no Python >= 3.12 found (jax >= 0.11 needs it).
  Looked at: $PYTHON, python3.14/3.13/3.12/python3/python on PATH, and pyenv's installed versions.
  Fix: install Python 3.12+ (e.g. `pyenv install 3.12`) or run `make PYTHON=/path/to/python3.12 ...`.
MSG
exit 1
