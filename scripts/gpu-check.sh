#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU and no network, in one call of at most 8 minutes —
#   1. installs the wheels of .gpu/wheels (scripts/gpu-wheels.sh, run beforehand where there is network) and
#      pretrieve from this checkout, both with `pip install --no-deps --no-index` into a temporary target,
#      on top of the image's own torch, transformers, sentence-transformers, typer, JAX …;
#   2. runs the GPU-marked tests (tests/test_gpu.py) and the install checks of tests/test_gpu_images.py and
#      tests/test_cli_typer.py against the image's packages;
#   3. `pretrieve bench pretrain --device cuda` at BERT-base shape (L12-H768, random init, batch 64 × 144, bf16),
#      whose report gives the achieved TFLOP/s of one BERT-base pre-training step against the 90 per H100 that the
#      recipe headers' hours assume (scripts/experiments/recipe_costs.py) — the report's first lines repeat it —
#      and `pretrieve bench encode --device cuda` (L12-H768, random init, 2,048 SciFact passages);
#   4. the every-stage recipe on CUDA: `pretrieve run configs/scifact-cpu.yaml` (SPLADE-tiny; SciFact and the
#      zero-shot collections from .gpu/data);
# and writes a small report under $OUT (the device tool's output folder; ./gpu-check-out when OUT is unset):
# gpu-check.md (machine, versions, each step's exit code and seconds, test summary, the benchmarks' and the
# recipe's reports), gpu-check.log (everything printed), pretrain.md/.json, encode.md/.json,
# scifact-cpu-results.md — seven files, none deeper than $OUT.
#
# Usage: bash scripts/gpu-check.sh        GPU_CHECK_SECONDS (default 450) caps the whole run; each step gets at
# most what is left of it, so a slow step cuts the later ones short instead of overrunning the call.
# See docs/benchmarks.md, "On a GPU".
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
CARRY=${GPU_CARRY:-$ROOT/.gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
REPORT="$OUT/gpu-check.md"
STEPS=$(mktemp)
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
DEADLINE=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-450} ))
FAILED=0

export PYTHONUNBUFFERED=1 PRETRIEVE_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PRETRIEVE_DATA=$CARRY/data
export PRETRIEVE_CACHE=$(mktemp -d /tmp/pretrieve-cache.XXXXXX)
SITE=$(mktemp -d /tmp/pretrieve-site.XXXXXX)
WORK=$(mktemp -d /tmp/pretrieve-gpu.XXXXXX)

# step NAME LIMIT_S COMMAND...: run with at most min(LIMIT_S, time left), record exit code and seconds
step() {
  local name=$1 limit=$2 began rc left
  shift 2
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 10 ]; then
    echo "| $name | skipped: the check's time was spent | 0 |" >>"$STEPS"
    FAILED=1
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (at most ${limit} s)"
  began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=1
  echo "| $name | $rc$([ "$rc" -eq 124 ] && echo ' (timed out)') | $(( $(date +%s) - began )) |" >>"$STEPS"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------- install
if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
  echo "error: no wheels under $CARRY/wheels (run scripts/gpu-wheels.sh where there is network, carry .gpu)"
  exit 2
fi
step "install: wheels (--no-deps --no-index)" 120 \
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$CARRY"/wheels/*.whl
export PYTHONPATH=$SITE
FAILED_BEFORE=$FAILED
if step "install: pretrieve from the checkout (--no-deps --no-index)" 120 \
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$ROOT"; then
  export PATH=$SITE/bin:$PATH
else   # the image's setuptools cannot build it: run the checkout's sources instead (not a failure of the check)
  FAILED=$FAILED_BEFORE
  echo "| (pretrieve runs from src/ through PYTHONPATH instead) | 0 | 0 |" >>"$STEPS"
  echo "pip could not install the checkout; running src/ through PYTHONPATH"
  export PYTHONPATH=$SITE:$ROOT/src
  mkdir -p "$WORK/bin"
  printf '#!/bin/sh\nexec %s -m pretrieve "$@"\n' "$PY" >"$WORK/bin/pretrieve"
  chmod +x "$WORK/bin/pretrieve"
  export PATH=$WORK/bin:$PATH
fi

# ---------------------------------------------------------------------------------------------- machine
MACHINE=$("$PY" - <<'EOF'
import importlib.metadata as m, platform, torch
names = ["torch", "transformers", "sentence-transformers", "typer", "click", "jax", "faiss-cpu", "faiss-gpu",
         "bm25s", "pretrieve"]
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "absent"
gpu = (f"{torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB, "
       f"CUDA {torch.version.cuda}") if torch.cuda.is_available() else "none seen by torch"
print(f"- GPU: {gpu}")
print(f"- python {platform.python_version()}; " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
)
echo "$MACHINE"
step "pretrieve --help (the image's typer)" 60 pretrieve --help >/dev/null

# ---------------------------------------------------------------------------------------------- tests
step "pytest: GPU-marked tests and the install checks" 150 \
  "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -rs tests/test_gpu.py tests/test_gpu_images.py \
  "tests/test_cli_typer.py::test_cli_starts_on_a_typer_without_display_type_rich"
PYTEST_SUMMARY=$(grep -E "(passed|failed|skipped|error).* in [0-9.]+s" "$LOG" | tail -1)

# ---------------------------------------------------------------------------------------------- benchmarks
step "bench pretrain --device cuda (L12-H768, batch 64 x 144, bf16)" 150 \
  pretrieve bench pretrain --device cuda --model L12-H768 --batch-size 64 --max-len 144 --bf16 \
  --steps 20 --warmup 5 --out "$OUT/pretrain.md" >/dev/null
step "bench encode --device cuda (L12-H768, 2048 SciFact passages)" 90 \
  pretrieve bench encode --device cuda --model L12-H768 --data scifact --num-texts 2048 --batch-size 128 \
  --max-length 256 --repeats 3 --out "$OUT/encode.md" >/dev/null

# ---------------------------------------------------------------------------------------------- recipe
step "pretrieve run configs/scifact-cpu.yaml (every stage, on CUDA)" 420 \
  pretrieve run configs/scifact-cpu.yaml --out "$WORK/scifact-cpu" --no-progress
[ -f "$WORK/scifact-cpu/results.md" ] && cp "$WORK/scifact-cpu/results.md" "$OUT/scifact-cpu-results.md"

# ---------------------------------------------------------------------------------------------- report
{
  echo "# pretrieve GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); checkout: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "$MACHINE"
  echo
  echo "| step | exit code | seconds |"
  echo "|---|---|---:|"
  cat "$STEPS"
  echo
  echo "- tests: ${PYTEST_SUMMARY:-no summary (see gpu-check.log)}"
  ACHIEVED=$(grep -h "achieved TFLOP/s" "$OUT/pretrain.md" 2>/dev/null | head -1)
  echo "${ACHIEVED:-- achieved TFLOP/s: not measured (the pretrain bench did not finish)} (BERT-base, batch 64 x 144, bf16)"
  for part in pretrain encode; do
    [ -f "$OUT/$part.md" ] && { echo; sed 's/^#/##/' "$OUT/$part.md"; }
  done
  if [ -f "$OUT/scifact-cpu-results.md" ]; then
    echo; echo "## pretrieve run configs/scifact-cpu.yaml on CUDA"; echo
    sed 's/^#/##/' "$OUT/scifact-cpu-results.md"
  fi
} >"$REPORT"
echo "wrote $REPORT"
exit "$FAILED"
