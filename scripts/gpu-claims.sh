#!/usr/bin/env bash
# Claims-benchmark cells on a lent GPU, run detached so that they outlive one device call, and their records
# brought back as they land.
#
# Here, once (network needed): bash scripts/gpu-wheels.sh     → .gpu/wheels (what the GPU image lacks) and
#                                                                 .gpu/data (the collections), both git-ignored
# Commit first: the GPU runs this checkout's HEAD (a clone of it), not uncommitted edits.
# The device calls (device tool; 15 minutes of device time a session, at most 10 minutes a call):
#     run(command="bash scripts/gpu-claims.sh tier1 --cells none:3,mlm:3 + tier2d --jobs 4", carry=[".gpu"],
#         timeout_s=600)
#   installs the wheels into a temporary target on top of the image's torch (no network, --no-deps), clones HEAD
#   and copies the collections and the committed records of each named tier into $STATE (default
#   /tmp/pretrieve-gpu-claims, outside the working tree that a later call re-syncs), and starts, for each tier
#   (tiers are separated by a lone '+', each with its own options), `scripts/experiments/claims.sh TIER
#   --jobs $CLAIMS_JOBS --threads 1 --no-commit [options]` there in a session of its own (setsid: the device tool
#   kills what a call leaves running, except such a one, which runs until the machine goes back). CLAIMS_JOBS
#   defaults to 12: a Tier-1 cell's processes are bound by their CPU core, not the GPU (measured on an H200: 12
#   processes fine-tune at the rate of one), so the jobs of all tiers together should not exceed the 16 cores.
#   Then it watches the runs.
#     run(command="bash scripts/gpu-claims.sh --watch", timeout_s=<what is left>)
#   on the same machine, while it is still warm (30 s after a call): watches again.
#   Watching, for at most $CLAIMS_WATCH_SECONDS (default 540) or until every run ends, it packs the records into
#   $OUT/records.tgz every 15 s (atomically: a call cut off at its limit still brings back the last pack) and copies
#   each run's log (its last 2 MiB) to $OUT/claims-TIER.log. A cell still running when the machine goes back is
#   lost; every finished one has its record.
# Back here: bash scripts/gpu-claims.sh --land FILES_AT/records.tgz
#   unpacks the records of every tier in it into results/claims/<tier> (a record is taken only if this checkout
#   lacks it or holds another version of it) and commits them, one commit naming the tiers and the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-}" = "--land" ]; then
  archive=${2:?usage: gpu-claims.sh --land records.tgz}
  unpack=$(mktemp -d)
  tar -xzf "$archive" -C "$unpack" || exit 2
  [ -d "$unpack/results/claims" ] || { echo "error: $archive has no results/claims/" >&2; exit 2; }
  landed=() tiers=()
  while IFS= read -r -d '' file; do
    rel=${file#"$unpack/"}
    if [ ! -f "$rel" ] || ! cmp -s "$file" "$rel"; then
      mkdir -p "$(dirname "$rel")" && cp "$file" "$rel" && landed+=("$rel")
      tier=${rel#results/claims/}; tier=${tier%%/*}
      [[ " ${tiers[*]} " == *" $tier "* ]] || tiers+=("$tier")
    fi
  done < <(find "$unpack/results/claims" -name '*.json' -print0 | sort -z)
  if [ "${#landed[@]}" -eq 0 ]; then echo "no new records"; exit 0; fi
  device=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print((r.get('machine') or {}).get('device', {}).get('name') or 'cpu')" "${landed[-1]}")
  tier_list=$(IFS=,; echo "${tiers[*]}")
  git add -- "${landed[@]}" && \
    git commit -q -m "Claims records ($tier_list): ${#landed[@]} records made on a lent GPU ($device)" -- "${landed[@]}"
  printf 'landed %s\n' "${landed[@]}"
  exit 0
fi

OUT=${OUT:-$ROOT/gpu-claims-out}
STATE=${STATE:-/tmp/pretrieve-gpu-claims}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-claims.log") 2>&1

runs() { for pidfile in "$STATE"/runs/*/run.pid; do [ -f "$pidfile" ] && basename "$(dirname "$pidfile")"; done; }
alive() { [ -f "$STATE/runs/$1/run.pid" ] && kill -0 "$(cat "$STATE/runs/$1/run.pid")" 2>/dev/null; }
any_alive() { local tier; for tier in $(runs); do alive "$tier" && return 0; done; return 1; }
pack() {   # the records so far, and each run's log, under $OUT (atomically)
  local tier
  tar -czf "$OUT/records.tgz.part" -C "$STATE" results/claims 2>/dev/null && mv -f "$OUT/records.tgz.part" "$OUT/records.tgz"
  for tier in $(runs); do tail -c 2000000 "$STATE/runs/$tier/run.log" > "$OUT/claims-$tier.log" 2>/dev/null; done
}
watch() {
  local until=$(( $(date +%s) + ${CLAIMS_WATCH_SECONDS:-540} )) next=0 tier
  while any_alive && [ "$(date +%s)" -lt "$until" ]; do
    if [ "$(date +%s)" -ge "$next" ]; then
      next=$(( $(date +%s) + 15 ))
      pack
      for tier in $(runs); do
        grep -aE '^\[[0-9]+/[0-9]+\] ' "$STATE/runs/$tier/run.log" 2>/dev/null | tail -n 2 | sed "s/^/  $tier | /"
      done
    fi
    sleep 1
  done
  pack
  for tier in $(runs); do
    if alive "$tier"; then echo "$tier goes on (pid $(cat "$STATE/runs/$tier/run.pid")): gpu-claims.sh --watch"
    else echo "$tier ended: $(tail -n 1 "$STATE/runs/$tier/run.log" 2>/dev/null)"; fi
  done
  echo "records: $(find "$STATE/results/claims" -name '*.json' -newer "$STATE/started" | wc -l) new"
  ls -la "$OUT"
}

if [ "${1:-}" = "--watch" ]; then
  [ -n "$(runs)" ] || { echo "error: no run was started on this machine ($STATE/runs)"; exit 2; }
  watch
  exit 0
fi

# the tiers and their options: TIER [options] [+ TIER [options]] ...
[ $# -gt 0 ] || { echo "usage: gpu-claims.sh TIER [options] [+ TIER [options]] ... | --watch | --land records.tgz"; exit 2; }
specs=() spec=""
for arg in "$@"; do
  if [ "$arg" = "+" ]; then specs+=("$spec"); spec=""; else spec+="${spec:+$'\x1f'}$arg"; fi
done
specs+=("$spec")
CARRY=${GPU_CARRY:-$ROOT/.gpu}
PY=${PYTHON:-python3}
if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 || [ ! -d "$CARRY/data/scifact" ]; then
  echo "error: no wheels or data under $CARRY (run scripts/gpu-wheels.sh where there is network, carry .gpu)"
  exit 2
fi
if any_alive; then echo "error: runs are going on this machine ($(runs | xargs)): gpu-claims.sh --watch"; exit 2; fi
rm -rf "$STATE" && mkdir -p "$STATE/results/claims" "$STATE/cache" "$STATE/runs"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" \
  "$CARRY"/wheels/*.whl || exit 2
# what the runs read, out of the synced working tree (a later call re-syncs it): HEAD, the collections, the records
git config --global --add safe.directory "$ROOT" 2>/dev/null || true
git clone -q "$ROOT" "$STATE/code" 2>/dev/null || { mkdir -p "$STATE/code" && cp -r src scripts "$STATE/code/"; }
# the working tree that was sent is what should run: where it differs from the git HEAD that came with it (edits
# not committed, or a stale .git on the device: seen once), it replaces the clone's, and the records say dirty
if [ -d "$STATE/code/.git" ] && ! git -C "$ROOT" diff --quiet HEAD -- src scripts 2>/dev/null; then
  echo "warning: src/ or scripts/ differ from HEAD $(git -C "$ROOT" rev-parse --short HEAD): the working tree's run" \
       "(its records say dirty: true)"
  rm -rf "$STATE/code/src" "$STATE/code/scripts" && cp -r src scripts "$STATE/code/"
fi
cp -r "$CARRY/data" "$STATE/data"
for spec in "${specs[@]}"; do
  tier=${spec%%$'\x1f'*}
  [ -d "results/claims/$tier" ] && cp -r "results/claims/$tier" "$STATE/results/claims/"
done
touch "$STATE/started"
export PYTHONUNBUFFERED=1 PRETRIEVE_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PRETRIEVE_DATA=$STATE/data PRETRIEVE_CACHE=$STATE/cache PYTHONPATH=$STATE/site:$STATE/code/src
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
echo "code: $(git -C "$STATE/code" log --oneline -1 2>/dev/null || echo 'a copy of src/ (no git)')"
cd "$STATE/code"
for spec in "${specs[@]}"; do
  IFS=$'\x1f' read -r -a words <<<"$spec"
  tier=${words[0]} options=("${words[@]:1}")
  mkdir -p "$STATE/runs/$tier"
  PRETRIEVE="$PY -m pretrieve" setsid nohup bash -c 'echo $$ > "$0"; exec "$@"' "$STATE/runs/$tier/run.pid" \
    bash scripts/experiments/claims.sh "$tier" --jobs "${CLAIMS_JOBS:-12}" --threads 1 --no-commit \
    --out "$STATE/runs/$tier/scratch" --records "$STATE/results/claims/$tier" "${options[@]}" \
    > "$STATE/runs/$tier/run.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -s "$STATE/runs/$tier/run.pid" ] && break; sleep 0.2; done
  echo "started $tier (pid $(cat "$STATE/runs/$tier/run.pid")): ${options[*]}"
done
cd "$ROOT"
watch
