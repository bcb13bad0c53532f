#!/usr/bin/env bash
# Set up (if needed) and run the end-to-end demo: the SciFact CPU recipe (configs/scifact-cpu.yaml) —
# BoW pre-training of SPLADE-tiny on the SciFact corpus → fine-tuning stage 1 (BM25 negatives) → mining →
# stage 2 → cross-encoder reranker → teacher scores → stage 3 (KL distillation) → evaluation on SciFact
# (in-domain) and Cranfield (zero-shot) next to BM25. About 15–20 minutes on 2 CPU cores.
# Output: outputs/scifact-cpu/ (results.md, results.json, runs/). Re-running skips finished stages;
# an interrupted run resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Collections: $PRETRIEVE_DATA, else ../shared/data beside the checkout, else the download cache
# (SciFact and Cranfield are downloaded by name on first use); or point the recipe at your copies:
#   .venv/bin/pretrieve run configs/scifact-cpu.yaml --data-root DIR   (DIR/scifact, DIR/cranfield)
.venv/bin/pretrieve run configs/scifact-cpu.yaml
cat outputs/scifact-cpu/results.md
