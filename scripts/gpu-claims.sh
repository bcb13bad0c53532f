#!/usr/bin/env bash
# Claims-benchmark cells on a lent GPU, run detached so that they outlive one device call, and their records
# brought back as they land.
#
# Here, once (network needed): bash scripts/gpu-wheels.sh     → .gpu/wheels (what the GPU image lacks) and
#                                                                 .gpu/data (the collections), both git-ignored
# Commit first: the GPU runs this checkout's HEAD (a clone of it), not uncommitted edits.
# The device calls (device tool; 15 minutes of device time a session, at most 10 minutes a call):
#     run(command="bash scripts/gpu-claims.sh tier1 --cells none:2,mlm:2", carry=[".gpu"], timeout_s=600)
#   installs the wheels into a temporary target on top of the image's torch (no network, --no-deps), clones HEAD
#   and copies the collections and the committed records into $STATE (default /tmp/pretrieve-gpu-claims, outside
#   the synced working tree), and starts `scripts/experiments/claims.sh TIER --jobs $CLAIMS_JOBS --threads
#   $CLAIMS_THREADS --no-commit [options]` there in a session of its own (setsid: the device tool kills what a
#   call leaves running, except such a one, which runs until the machine goes back). Defaults: 12 jobs of 1
#   thread (one small cell uses a fraction of the GPU and of its 16 cores). Then it watches the run.
#     run(command="bash scripts/gpu-claims.sh --watch tier1", timeout_s=<what is left>)
#   on the same machine, while it is still warm (30 s after a call): watches again.
#   Watching, for at most $CLAIMS_WATCH_SECONDS (default 540) or until the run ends, it packs the records into
#   $OUT/records.tgz every 15 s (atomically: a call cut off at its limit still brings back the last pack) and copies
#   the run's log (its last 4 MiB) to $OUT/claims-run.log. A cell still running when the machine goes back is lost;
#   every finished one has its record.
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
STATE=${STATE:-/tmp/pretrieve-gpu-claims}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-claims.log") 2>&1

pack() {   # the records so far, and the run's log, under $OUT (atomically)
  tar -czf "$OUT/records.tgz.part" -C "$STATE" "results/claims/$tier" 2>/dev/null && \
    mv -f "$OUT/records.tgz.part" "$OUT/records.tgz"
  [ -f "$STATE/run.log" ] && tail -c 4000000 "$STATE/run.log" > "$OUT/claims-run.log"
}
alive() { [ -f "$STATE/run.pid" ] && kill -0 "$(cat "$STATE/run.pid")" 2>/dev/null; }
watch() {
  local until=$(( $(date +%s) + ${CLAIMS_WATCH_SECONDS:-540} ))
  while alive && [ "$(date +%s)" -lt "$until" ]; do
    pack
    grep -E '^\[[0-9]+\] .*(done|failed|running)' "$STATE/run.log" 2>/dev/null | tail -n 3 | sed 's/^/  | /'
    sleep 15
  done
  pack
  if alive; then echo "the run goes on (pid $(cat "$STATE/run.pid")); watch again: gpu-claims.sh --watch $tier"
  else echo "the run ended: $(tail -n 1 "$STATE/run.log" 2>/dev/null)"; fi
  echo "records: $(find "$STATE/results/claims/$tier" -name '*.json' -newer "$STATE/started" | wc -l) new"
  ls -la "$OUT"
}

if [ "$tier" = "--watch" ]; then
  tier=${1:?usage: gpu-claims.sh --watch TIER}
  [ -f "$STATE/run.pid" ] || { echo "error: no run was started on this machine ($STATE/run.pid)"; exit 2; }
  watch
  exit 0
fi

CARRY=${GPU_CARRY:-$ROOT/.gpu}
PY=${PYTHON:-python3}
if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 || [ ! -d "$CARRY/data/scifact" ]; then
  echo "error: no wheels or data under $CARRY (run scripts/gpu-wheels.sh where there is network, carry .gpu)"
  exit 2
fi
if alive; then echo "error: a run is already going on this machine (pid $(cat "$STATE/run.pid")): gpu-claims.sh --watch $tier"; exit 2; fi
rm -rf "$STATE" && mkdir -p "$STATE/results/claims" "$STATE/cache"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" \
  "$CARRY"/wheels/*.whl || exit 2
# what the run reads, out of the synced working tree (a later call re-syncs it): HEAD, the collections, the records
git config --global --add safe.directory "$ROOT" 2>/dev/null || true
git clone -q "$ROOT" "$STATE/code" 2>/dev/null || { mkdir -p "$STATE/code" && cp -r src scripts "$STATE/code/"; }
cp -r "$CARRY/data" "$STATE/data"
[ -d "results/claims/$tier" ] && cp -r "results/claims/$tier" "$STATE/results/claims/"
touch "$STATE/started"
export PYTHONUNBUFFERED=1 PRETRIEVE_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PRETRIEVE_DATA=$STATE/data PRETRIEVE_CACHE=$STATE/cache PYTHONPATH=$STATE/site:$STATE/code/src
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
echo "code: $(git -C "$STATE/code" log --oneline -1 2>/dev/null || echo 'a copy of src/ (no git)')"
cd "$STATE/code"
PRETRIEVE="$PY -m pretrieve" setsid nohup bash -c 'echo $$ > "$0"; exec "$@"' "$STATE/run.pid" \
  bash scripts/experiments/claims.sh "$tier" --jobs "${CLAIMS_JOBS:-12}" --threads "${CLAIMS_THREADS:-1}" \
  --no-commit --out "$STATE/scratch" --records "$STATE/results/claims/$tier" "$@" > "$STATE/run.log" 2>&1 < /dev/null &
for _ in $(seq 50); do [ -s "$STATE/run.pid" ] && break; sleep 0.2; done
cd "$ROOT"
echo "started $tier (pid $(cat "$STATE/run.pid")): $*"
watch
