#!/usr/bin/env bash
# The claims benchmark's tiers as they run (docs/results.md, "cells, records, progress"; docs/preregistration.md,
# section A and amendment 9): one place for each tier's settings, so that a CPU session, a lent GPU
# (scripts/gpu-claims.sh) and a fresh clone all run the same comparison and write to the same records directory.
#
#   bash scripts/experiments/claims.sh tier1 --select-only          # the dev grid (its points without a record)
#   bash scripts/experiments/claims.sh tier1 --cells mlm:1,bow:1    # some arm × seed cells
#   bash scripts/experiments/claims.sh tier1                        # every cell without a current record
#   bash scripts/experiments/claims.sh tier1 --report-only          # progress and tables, from the records alone
#
# Extra options are passed on (the defaults below: --jobs 2 --threads 1 --commit, for a 2-core CPU; a later option
# wins). Records go to results/claims/<tier>/ and are committed as they land; scratch to outputs/claims-<tier>/.
# PRETRIEVE (default: the `pretrieve` on PATH, else .venv/bin/pretrieve) is the command that runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
tier=${1:?usage: claims.sh TIER [bench quality options]}
shift
if [ -n "${PRETRIEVE:-}" ]; then read -r -a run <<<"$PRETRIEVE"
elif command -v pretrieve >/dev/null; then run=(pretrieve)
else run=(.venv/bin/pretrieve); fi
common=(--pretrain-data scifact,cranfield --train scifact --eval scifact,cranfield --folds train:test,test:train
        --dev-queries 100 --seed 1 --precision fp32 --out "outputs/claims-$tier" --records "results/claims/$tier")
case "$tier" in
  tier1)
    args=(--base splade-tiny --methods none,mlm,bow,retromae,tsdae,mlm-aa --grid-lr 1e-4,3e-4,1e-3
          --grid-epochs 5,10,20,40 --grid-grow-lr 3e-3 --grid-grow-epochs 80 --select-arm mlm --probe-steps 100,300,600 --budget 600
          --finetune num_negatives=3 --seeds 3
          --contrasts bow-mlm,retromae-mlm,bow-none,retromae-none,mlm-none,anchor:tsdae-mlm,anchor:tsdae-none,anchor:bow-retromae,aa:mlm-aa-mlm) ;;
  *) echo "error: unknown tier '$tier' (this script knows tier1; docs/results.md has the later tiers' commands)" >&2
     exit 2 ;;
esac
report=0
for option in "$@"; do [ "$option" = "--report-only" ] && report=1; done
if [ "$report" = 1 ]; then
  exec "${run[@]}" bench quality --out "outputs/claims-$tier" --records "results/claims/$tier" "$@"
fi
exec "${run[@]}" bench quality "${common[@]}" "${args[@]}" --jobs 2 --threads 1 --commit "$@"
