#!/usr/bin/env bash
# Set up (if needed) and run the end-to-end demo on SciFact:
# BM25 and dense retrieval (offline all-MiniLM-L6-v2), evaluated side by side with significance marks.
# Data: $PRETRIEVE_DATA/scifact (default ../shared/data/scifact). Output: outputs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DATA=${PRETRIEVE_DATA:-../shared/data}/scifact
OUT=outputs/demo
mkdir -p "$OUT"
P=.venv/bin/pretrieve
$P data check "$DATA"
$P bm25 --data "$DATA" --split test --out "$OUT/bm25.trec"
$P dense --model minilm --data "$DATA" --split test --out "$OUT/dense-minilm.trec" --cache "$OUT/emb-minilm"
$P evaluate --data "$DATA" --split test "$OUT/bm25.trec" "$OUT/dense-minilm.trec" \
  --json "$OUT/results.json" --md "$OUT/results.md"
echo "results: $OUT/results.md"
