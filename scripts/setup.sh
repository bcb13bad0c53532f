#!/usr/bin/env bash
# Create .venv (once) and install pretrieve with its test extras (FAISS, the offline models, pytest).
# torch is installed first and pinned to 2.13.0: on our machines that is a CPU wheel on disk; pyproject.toml asks
# for a range (a site's CUDA build is kept), which on a machine without torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.pretrieve-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
