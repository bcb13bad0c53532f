#!/usr/bin/env bash
# Claims-benchmark cells on a lent GPU, in one device call of at most 8 minutes, and their records brought back.
#
# Here, once (network needed): bash scripts/gpu-wheels.sh     → .gpu/wheels (what the GPU image lacks) and
#                                                                 .gpu/data (the collections), both git-ignored
# The device call (device tool; 15 minutes of device time a session, so one full call):
#     run(command="bash scripts/gpu-claims.sh tier1", carry=[".gpu"], timeout_s=540)
#   It installs the wheels into a temporary target on top of the image's torch (no network, --no-deps), runs
#   `scripts/experiments/claims.sh TIER --jobs $CLAIMS_JOBS --threads $CLAIMS_THREADS` (defaults 6 and 2: one cell
#   uses a fraction of an H100 and of its 16 cores) for at most $CLAIMS_SECONDS (default 420; a cell still running
#   then is lost, every finished one has its record), then packs results/claims/TIER (the records already committed
#   travel with the checkout, so only the missing cells run) into $OUT/records.tgz with the log.
# Back here: bash scripts/gpu-claims.sh --land FILES_AT/records.tgz TIER
#   unpacks the records into results/claims/TIER (a record is taken only if this checkout lacks it or has an
#   older one of the same cell) and commits them, one commit naming the GPU that made them.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-}" = "--land" ]; then
  archive=${2:?usage: gpu-claims.sh --land records.tgz TIER}
  tier=${3:?usage: gpu-claims.sh --land records.tgz TIER}
  unpack=$(mktemp -d)
  tar -xzf "$archive" -C "$unpack" || exit 2
  [ -d "$unpack/results/claims/$tier" ] || { echo "error: $archive has no results/claims/$tier" >&2; exit 2; }
  landed=()
  while IFS= read -r -d '' file; do
    rel=${file#"$unpack/"}
    if [ ! -f "$rel" ] || ! cmp -s "$file" "$rel"; then
      mkdir -p "$(dirname "$rel")" && cp "$file" "$rel" && landed+=("$rel")
    fi
  done < <(find "$unpack/results/claims/$tier" -name '*.json' -print0)
  if [ "${#landed[@]}" -eq 0 ]; then echo "no new records"; exit 0; fi
  device=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print((r.get('machine') or {}).get('device', {}).get('name') or 'cpu')" "${landed[-1]}")
  git add -- "${landed[@]}" && git commit -q -m "Claims records ($tier): ${#landed[@]} records made on a lent GPU ($device)" -- "${landed[@]}"
  printf 'landed %s\n' "${landed[@]}"
  exit 0
fi

tier=${1:-tier1}
shift || true
OUT=${OUT:-$ROOT/gpu-claims-out}
CARRY=${GPU_CARRY:-$ROOT/.gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-claims.log") 2>&1
if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 || [ ! -d "$CARRY/data/scifact" ]; then
  echo "error: no wheels or data under $CARRY (run scripts/gpu-wheels.sh where there is network, carry .gpu)"
  exit 2
fi
export PYTHONUNBUFFERED=1 PRETRIEVE_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PRETRIEVE_DATA=$CARRY/data PRETRIEVE_CACHE=$(mktemp -d /tmp/pretrieve-cache.XXXXXX)
SITE=$(mktemp -d /tmp/pretrieve-site.XXXXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$CARRY"/wheels/*.whl || exit 2
export PYTHONPATH=$SITE:$ROOT/src
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
git config --global --add safe.directory "$ROOT" 2>/dev/null || true
started=$(date +%s)
PRETRIEVE="$PY -m pretrieve" timeout --kill-after=15 "${CLAIMS_SECONDS:-420}" \
  bash scripts/experiments/claims.sh "$tier" --jobs "${CLAIMS_JOBS:-6}" --threads "${CLAIMS_THREADS:-2}" \
  --no-commit "$@"
echo "claims.sh: exit $? after $(( $(date +%s) - started )) s"
tar -czf "$OUT/records.tgz" results/claims/"$tier"
ls -la "$OUT"
