#!/usr/bin/env bash
# Set up (if needed) and run the end-to-end demo on SciFact:
# BM25 and dense retrieval (offline all-MiniLM-L6-v2), evaluated side by side with significance marks.
# Output: outputs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Collections: $PRETRIEVE_DATA, else ../shared/data beside the checkout, else /work/shared/data.
ROOT=${PRETRIEVE_DATA:-}
if [ -z "$ROOT" ]; then
  for candidate in ../shared/data /work/shared/data; do
    if [ -d "$candidate/scifact" ]; then ROOT=$candidate; break; fi
  done
fi
DATA=${ROOT:-../shared/data}/scifact
OUT=outputs/demo
mkdir -p "$OUT"
P=.venv/bin/pretrieve
$P data check "$DATA"
$P bm25 --data "$DATA" --split test --out "$OUT/bm25.trec"
$P dense --model minilm --data "$DATA" --split test --out "$OUT/dense-minilm.trec" --cache "$OUT/emb-minilm"
$P evaluate --data "$DATA" --split test "$OUT/bm25.trec" "$OUT/dense-minilm.trec" \
  --json "$OUT/results.json" --md "$OUT/results.md"
echo "results: $OUT/results.md"
