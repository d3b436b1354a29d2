#!/usr/bin/env bash
# Every CPU benchmark whose results are committed in this folder, one after another (never two at once:
# they compete for the same cores). From the repository root, with the peers installed:
#   pip install -e ".[bench]" && bash results/bench/reproduce.sh      # about an hour on 2 cores
# Generated corpora go to $WORK (default: the system temp directory); nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/bench
work=(${WORK:+--workdir "$WORK"})
python3 -m gpu_dedup bench peers --results "$out" "${work[@]}"  # peers, scaling
python3 -m gpu_dedup bench index --results "$out" "${work[@]}"  # 1 M-document index
python3 -m gpu_dedup bench skew --results "$out" "${work[@]}"  # 10% boilerplate, 10% empty
python3 -m gpu_dedup bench workers --results "$out" "${work[@]}"  # 1 process vs 1, 2 workers
python3 -m gpu_dedup bench workers --documents 1500000 --workers 2 --memory-limit 1.5GiB --block-rows 20000 \
  --results "$out" "${work[@]}"  # workers under a memory limit
