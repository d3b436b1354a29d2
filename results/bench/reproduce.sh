#!/usr/bin/env bash
# Every CPU benchmark whose results are committed in this folder, one after another (never two at once:
# they compete for the same cores). From the repository root, with the peers installed:
#   pip install -e ".[bench]" && bash results/bench/reproduce.sh      # about 105 minutes on 2 cores
# Generated corpora go to $WORK (default: the system temp directory); nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/bench
work=(${WORK:+--workdir "$WORK"})
python3 -m gpu_dedup bench peers --results "$out" "${work[@]}"  # peers, scaling
python3 -m gpu_dedup bench index --results "$out" "${work[@]}"  # 1 M-document index
python3 -m gpu_dedup bench skew --results "$out" "${work[@]}"  # 10% boilerplate, 10% empty
python3 -m gpu_dedup bench stages --repeat 7 --results "$out" "${work[@]}"  # read, normalize, write against limits
docs=(--documents 100000 1000000 4000000 --workers 2 --boilerplate 0.2 --single-up-to 4000000)
python3 -m gpu_dedup bench workers "${docs[@]}" --results "$out" "${work[@]}"  # 1 process vs 2 workers
python3 -m gpu_dedup bench workers "${docs[@]}" --block-rows 100000 --no-running --results "$out/blocks-100k" \
  "${work[@]}"
python3 -m gpu_dedup bench workers --documents 100000 1000000 --workers 2 --boilerplate 0.2 --repeat 3 \
  --results "$out/repeated" "${work[@]}"  # each configuration 3 times in turn: median wall times
python3 -m gpu_dedup bench workers --documents 1500000 --workers 2 --memory-limit 1.5GiB --block-rows 20000 \
  --results "$out" "${work[@]}"  # workers under a memory limit
for run in layouts layouts/second-run; do  # 10^5 and 10^6 documents, one row group and row groups of 10^4, twice
  python3 -m gpu_dedup bench peers --sizes 100000 1000000 --layouts one-row-group many-row-groups \
    --tools gpu_dedup rensa --peer-max-docs 1000000 --real none --results "$out/$run" "${work[@]}"
done
