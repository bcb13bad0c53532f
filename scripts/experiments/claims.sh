#!/usr/bin/env bash
# The claims benchmark's tiers as they run (docs/results.md, "cells, records, progress"; docs/preregistration.md,
# section A and amendment 9): one place for each tier's settings, so that a CPU session, a lent GPU
# (scripts/gpu-claims.sh) and a fresh clone all run the same comparison and write to the same records directory.
#
#   bash scripts/experiments/claims.sh tier1 --select-only          # the dev grid (its points without a record)
#   bash scripts/experiments/claims.sh tier1 --cells mlm:1,bow:1    # some arm × seed cells
#   bash scripts/experiments/claims.sh tier1                        # every cell without a current record
#   bash scripts/experiments/claims.sh tier1 --report-only          # progress and tables, from the records alone
#   bash scripts/experiments/claims.sh tier1 --background           # every cell, in the background (see below)
#   bash scripts/experiments/claims.sh tier1 --stop                 # stop the background run (it resumes later)
#   bash scripts/experiments/claims.sh all --background             # every tier in order, each until it is done
#   bash scripts/experiments/claims.sh decide                       # the decision table from every tier's records
#   TIER: tier1, tier2a, tier2b (its from-scratch base is built first), tier2c, tier2d or tier3; or all: the tiers
#   in the registered order (Tier 1, then the review's: 2b, 2c, 2d, 3, 2a), one after the other, each resuming
#   from its records and skipped in no time once every cell of it is recorded; a tier that ends in an error (Tier
#   2b's base failing its gate) is reported and the next one runs. Extra options go to every tier (not --cells).
#
# --background (first option after the tier) pins the code: it checks out this checkout's HEAD, detached, in the
# git worktree outputs/claims-<tier>-code (made once), and runs the tier from there with setsid/nohup, so that the
# run outlives this shell and later commits here change nothing under it; records still land (and are committed)
# in this checkout's results/claims/<tier>/, scratch in its outputs/claims-<tier>/, the log in
# outputs/claims-<tier>.log; the collections are looked up where this checkout finds them ($PRETRIEVE_DATA, else
# ../shared/data beside it). Run it again at the start of each session: an interrupted run resumes from its records
# (cells, and the folds of unfinished cells) and from the scratch checkpoints (on the same machine). It refuses to
# start while the last one still runs.
#
# Extra options are passed on (the defaults below: --jobs 2 --threads 1 --commit, for a 2-core CPU; a later option
# wins). Records go to results/claims/<tier>/ and are committed as they land; scratch to outputs/claims-<tier>/.
# PRETRIEVE (default: the `pretrieve` on PATH, else .venv/bin/pretrieve) is the command that runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
self="$PWD/scripts/experiments/claims.sh"    # this script, also when it was called by a path relative to elsewhere
tier=${1:?usage: claims.sh TIER|all [--background|--stop] [bench quality options] | claims.sh decide [bench claims options]}
shift
TIERS_IN_ORDER=(tier1 tier2b tier2c tier2d tier3 tier2a)   # the pre-registration's Tier 1, then the review's order
# the command that runs the tier (absolute, so that the background run finds it from its worktree too)
if [ -n "${PRETRIEVE:-}" ]; then read -r -a run <<<"$PRETRIEVE"
elif command -v pretrieve >/dev/null; then run=("$(command -v pretrieve)")
else run=("$PWD/.venv/bin/pretrieve"); fi
pidfile="outputs/claims-$tier.pid"
# where scratch that is not a tier's --out lives (Tier 2b's base): this checkout, also for a run from its worktree
root_dir=${PRETRIEVE_CLAIMS_ROOT:-$PWD}
# the background run's process group is alive and is that run (its leader carries PRETRIEVE_CLAIMS_TIER: a pid
# reused by another process after a reboot is not taken for it)
running() {   # [TIER]: this tier's run by default
  local name=${1:-$tier} file="outputs/claims-${1:-$tier}.pid"
  [ -f "$file" ] && kill -0 "$(cat "$file")" 2>/dev/null || return 1
  local environ="/proc/$(cat "$file")/environ"
  [ ! -r "$environ" ] || tr '\0' '\n' < "$environ" | grep -qx "PRETRIEVE_CLAIMS_TIER=$name"
}
if [ "$tier" = decide ]; then  # `pretrieve bench claims` over every tier that has records (results/claims/claims.md)
  given=()
  for pair in tier1:--tier1 tier2a:--budget tier2b:--scratch tier2c:--dupmae tier2d:--cdmae tier3:--minilm; do
    dir="results/claims/${pair%%:*}"
    # Tier 2b counts with its base's gate alone: a base that fails it runs no cell (the row says why)
    if [ -f "$dir/tier.json" ] || { [ "${pair%%:*}" = tier2b ] && [ -f "$dir/gate.json" ]; }; then
      given+=("${pair#*:}" "$dir")
    fi
  done
  [ "${#given[@]}" -gt 0 ] || { echo "error: no tier has records yet (results/claims/*/tier.json)" >&2; exit 2; }
  # the cost row's one-machine measurement (amendment 15), where it has been made: docs/results.md says how
  if [ -f results/claims/cost/bow-mlm.json ]; then given+=(--cost results/claims/cost/bow-mlm.json); fi
  exec "${run[@]}" bench claims "${given[@]}" --out results/claims/claims "$@"
fi
if [ "${1:-}" = "--stop" ]; then
  if running; then kill -- "-$(cat "$pidfile")" && echo "stopped the $tier run (process group $(cat "$pidfile"))"
  else echo "no $tier run is running"; fi
  rm -f "$pidfile"
  exit 0
fi
if [ "${1:-}" = "--background" ]; then
  shift
  # one background run per tier: `all` runs every tier, so it and a single tier's run exclude each other
  others=("$tier"); if [ "$tier" = all ]; then others+=("${TIERS_IN_ORDER[@]}"); else others+=(all); fi
  for other in "${others[@]}"; do
    if running "$other"; then
      echo "error: a $other run is already running (process group $(cat "outputs/claims-$other.pid"); log" \
           "outputs/claims-$other.log; stop it with: bash scripts/experiments/claims.sh $other --stop)" >&2
      exit 2
    fi
  done
  root=$PWD code="$PWD/outputs/claims-$tier-code" head=$(git rev-parse HEAD)
  git diff --quiet HEAD -- src scripts || echo "warning: uncommitted changes in src/ or scripts/ do not run" \
    "(the background run checks out HEAD, $head)" >&2
  mkdir -p outputs
  if [ -d "$code/.git" ] || [ -f "$code/.git" ]; then git -C "$code" checkout -q --detach "$head"
  else git worktree add -q --detach "$code" "$head"; fi
  # the worktree is not beside ../shared/data as this checkout is: name that collection root explicitly
  if [ -z "${PRETRIEVE_DATA:-}" ] && [ -d "$root/../shared/data" ]; then
    PRETRIEVE_DATA=$(cd "$root/../shared/data" && pwd); export PRETRIEVE_DATA
  fi
  rm -f "$pidfile"
  # its own session and process group (setsid), whose leader writes its pid (the group's id) before it runs the tier
  where=(--out "$root/outputs/claims-$tier" --records "$root/results/claims/$tier")
  [ "$tier" != all ] || where=()      # each tier of the sequence names its own (below)
  PYTHONPATH="$code/src${PYTHONPATH:+:$PYTHONPATH}" PRETRIEVE="${run[*]}" PRETRIEVE_CLAIMS_TIER=$tier PRETRIEVE_CLAIMS_ROOT=$root setsid nohup \
    bash -c 'echo $$ > "$0"; exec "$@"' "$root/$pidfile" bash "$code/scripts/experiments/claims.sh" "$tier" \
    "${where[@]}" "$@" >> "outputs/claims-$tier.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -s "$pidfile" ] && break; sleep 0.1; done
  echo "running $tier in the background at ${head:0:7} (process group $(cat "$pidfile")); log:" \
       "outputs/claims-$tier.log; progress: bash scripts/experiments/claims.sh $tier --report-only;" \
       "stop: bash scripts/experiments/claims.sh $tier --stop"
  exit 0
fi
report=0
for option in "$@"; do [ "$option" = "--report-only" ] && report=1; done
if [ "$tier" = all ]; then     # the tiers in order, each into its own records and scratch (in this checkout)
  status=0
  for next in "${TIERS_IN_ORDER[@]}"; do
    if [ "$report" = 1 ] && [ ! -f "$root_dir/results/claims/$next/tier.json" ]; then
      echo "== $next: not started (no results/claims/$next/tier.json)"; continue
    fi
    echo "== claims.sh $next ($(date -u '+%Y-%m-%d %H:%M') UTC)"
    code=0
    bash "$self" "$next" --out "$root_dir/outputs/claims-$next" --records "$root_dir/results/claims/$next" "$@" || code=$?
    if [ "$code" != 0 ]; then
      echo "claims.sh $next ended with exit code $code; going on with the next tier" >&2
      status=$code
    fi
  done
  exit "$status"
fi
common=(--pretrain-data scifact,cranfield --train scifact --eval scifact,cranfield --folds train:test,test:train
        --dev-queries 100 --seed 1 --precision fp32 --out "outputs/claims-$tier" --records "results/claims/$tier")
TIER1_PROTOCOL="lr=0.001,epochs=80"     # Tier 1's protocol, chosen on dev (docs/results.md, "Tier 1 progress")
case "$tier" in
  tier1)
    args=(--base splade-tiny --methods none,mlm,bow,retromae,tsdae,mlm-aa --grid-lr 1e-4,3e-4,1e-3
          --grid-epochs 5,10,20,40 --grid-grow-lr 3e-3 --grid-grow-epochs 80 --select-arm mlm --probe-steps 100,300,600 --budget 600
          --finetune num_negatives=3 --seeds 3
          --contrasts bow-mlm,retromae-mlm,bow-none,retromae-none,mlm-none,anchor:tsdae-mlm,anchor:tsdae-none,anchor:bow-retromae,aa:mlm-aa-mlm) ;;
  # the later tiers (pre-registration section A, amendment 9; docs/results.md, "The later tiers"). 2a, 2c and 2d
  # fine-tune with Tier 1's protocol, chosen on dev (results/claims/tier1: lr 1e-3 x 80 epochs); Tier 3 chooses
  # its own on dev (amendment 5), and so does Tier 2b, whose from-scratch base is built first.
  tier2b)   # the from-scratch base (amendment 6; built first, scratch_base below) and its arms, its own grid
    base="$root_dir/outputs/scratch-bert"
    args=(--base "$base/final" --methods none,mlm,bow,retromae --grid-lr 1e-4,3e-4,1e-3 --grid-epochs 5,10,20,40
          --grid-grow-lr 3e-3 --grid-grow-epochs 80 --select-arm mlm --budget 600 --finetune num_negatives=3 --seeds 2
          --contrasts bow-mlm,retromae-mlm,bow-none,retromae-none,mlm-none) ;;
  tier2a)   # budget sensitivity: mlm against bow at 6,000 pre-training steps, 3 seeds
    args=(--base splade-tiny --methods mlm,bow --budget 6000 --finetune "num_negatives=3,$TIER1_PROTOCOL" --seeds 3
          --contrasts bow-mlm) ;;
  tier2c)   # DupMAE's CLS+OT representation: retromae (Tier 1's checkpoints: copied from Tier 1's scratch where it
            # has them with the same settings and inputs, else pre-trained again from the same seeds) against dupmae
    args=(--base splade-tiny --methods retromae,dupmae --budget 600
          --finetune "num_negatives=3,representation=dupmae,$TIER1_PROTOCOL" --seeds 2 --contrasts dupmae-retromae
          --pretrained-from "$root_dir/outputs/claims-tier1") ;;
  tier2d)   # PMI importance masking against random masking
    args=(--base splade-tiny --methods cdmae,cdmae-random --budget 600 --finetune "num_negatives=3,$TIER1_PROTOCOL"
          --seeds 2 --contrasts cdmae-cdmae-random) ;;
  tier3)    # all-MiniLM-L6-v2 pre-trained on the vector it retrieves with; its own grid (amendment 5)
    args=(--base minilm --methods none,mlm,bow,tsdae --pretrain bottleneck=mean --budget 600 --lr 2e-5 --batch-size 16
          --max-len 144 --grid-lr 1e-5,2e-5,5e-5 --grid-epochs 1,2 --select-arm mlm
          --finetune num_negatives=3,batch_size=32 --seeds 2 --contrasts mlm-none,bow-none,tsdae-none,bow-mlm) ;;
  *) echo "error: unknown tier '$tier' (this script knows tier1, tier2a, tier2b, tier2c, tier2d, tier3, all and decide)" >&2
     exit 2 ;;
esac
if [ "$report" = 1 ]; then
  exec "${run[@]}" bench quality --out "outputs/claims-$tier" --records "results/claims/$tier" "$@"
fi

# Tier 2b's base (docs/results.md, "The later tiers"): a random L2-H128 BERT with SPLADE-tiny's uncased vocabulary,
# MLM-trained 3,000 steps (lr 5e-4) on Tier 1's pre-training union less every 20th passage, which its gate holds out
# (amendment 6). Not a cell and not committed, but re-made bit for bit on one machine kind at one thread (tier.json
# names it by the digest of its files, so a base made otherwise is refused); each step is skipped when done, and
# the pre-training resumes from its checkpoints. A base below the gate's accuracy (0.25) cannot inform: no cell runs.
scratch_base() {
  local dir=$1; shift
  local records="$root_dir/results/claims/tier2b" option previous="" commit=1
  for option in "$@"; do
    [ "$previous" = "--records" ] && records=$option
    [ "$option" = "--no-commit" ] && commit=0; [ "$option" = "--commit" ] && commit=1; previous=$option
  done
  # a gate that failed is final (amendment 11): its committed record is not re-earned on a new machine
  if [ -f "$records/gate.json" ] && python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["gate"]["passed"] is not False)' \
       "$records/gate.json"; then
    echo "error: the from-scratch base failed its gate ($records/gate.json, committed): it cannot inform" \
         "(amendment 11); Tier 2b's cells do not run" >&2
    return 2
  fi
  local outputs="$root_dir/outputs" corpus="$root_dir/outputs/claims-tier1/pretrain-data/scifact+cranfield.jsonl"
  local heldout="$root_dir/outputs/scratch-mlm-heldout.jsonl" train="$root_dir/outputs/scratch-mlm-train.jsonl"
  mkdir -p "$outputs"
  if [ ! -f "$corpus" ]; then   # Tier 1's harness writes its pre-training union on start (no cell runs here)
    bash "$self" tier1 --select-only --no-commit --out "$outputs/claims-tier1" --records "$root_dir/results/claims/tier1" \
      >/dev/null || return 2
  fi
  [ -f "$train" ] || { awk 'NR % 20 != 0' "$corpus" > "$train.part" && mv "$train.part" "$train"; } || return 2
  [ -f "$heldout" ] || { awk 'NR % 20 == 0' "$corpus" > "$heldout.part" && mv "$heldout.part" "$heldout"; } || return 2
  local one=(env OMP_NUM_THREADS=1 "${run[@]}")   # the cells' thread count: the same bits on one machine kind
  [ -f "$outputs/scratch-init/config.json" ] || "${one[@]}" init-model --shape L2-H128 --tokenizer splade-tiny \
    --out "$outputs/scratch-init" --seed 0 || return 2
  "${one[@]}" pretrain --method mlm --model "$outputs/scratch-init" --corpus "$train" --steps 3000 --lr 5e-4 \
    --batch-size 32 --max-len 144 --precision fp32 --out "$dir" --resume || return 2
  [ -f "$dir/gate/mlm_accuracy.json" ] || "${one[@]}" analyze mlm-accuracy --model "$dir/final" --corpus "$heldout" \
    --out "$dir/gate" || return 2
  local accuracy   # "<accuracy> <passed>" of analyze mlm-accuracy's report (its gate: accuracy >= 0.25)
  accuracy=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["accuracy"], r["gate"]["passed"])' \
    "$dir/gate/mlm_accuracy.json") || return 2
  # the gate's report joins the tier's records (bench claims reads it there, also when it failed), committed unless
  # --no-commit
  if ! cmp -s "$dir/gate/mlm_accuracy.json" "$records/gate.json"; then
    mkdir -p "$records" && cp "$dir/gate/mlm_accuracy.json" "$records/gate.json"
    if [ "$commit" = 1 ]; then
      git -C "$root_dir" add -- "$records/gate.json" && git -C "$root_dir" commit -q -m \
        "Claims records (tier2b): gate.json, the from-scratch base's held-out MLM accuracy ${accuracy% *}" \
        -- "$records/gate.json" || echo "warning: could not commit $records/gate.json" >&2
    fi
  fi
  if [ "${accuracy#* }" != True ]; then
    echo "error: the from-scratch base's held-out MLM accuracy is ${accuracy% *} (< 0.25, $records/gate.json):" \
         "it fails its gate and cannot inform (amendment 11); Tier 2b's cells do not run" >&2
    return 2
  fi
  echo "the from-scratch base: $dir/final (held-out MLM accuracy ${accuracy% *})"
}
if [ "$tier" = tier2b ]; then scratch_base "$base" "$@" || exit 2; fi
exec "${run[@]}" bench quality "${common[@]}" "${args[@]}" --jobs 2 --threads 1 --commit "$@"
