#!/usr/bin/env bash
# Rebuild the real corpora from the installed Debian packages and evaluate the default
# configuration on each against exact all-pairs Jaccard (whole corpus, no sampling).
# Usage, from the repository root with the package installed (pip install -e ".[eval]"):
#   bash results/eval/reproduce.sh            # data in $DATA (default /tmp/gpu-dedup-data)
set -euo pipefail
cd "$(dirname "$0")/../.."
data="${DATA:-/tmp/gpu-dedup-data}"
out=results/eval
mkdir -p "$data"
for name in debian-man debian-copyright debian-licenses; do
  python3 -m gpu_dedup dataset "$name" -o "$data/$name.parquet" --info "$out/$name/dataset.json"
done
common=(--sample 0 --id-column id --backend cpu --compare-split-chains --lsh-seeds 8 -q)
python3 -m gpu_dedup evaluate "$data/debian-man.parquet" -o "$out/debian-man" "${common[@]}" \
  | tee "$out/debian-man/summary.txt"
python3 -m gpu_dedup evaluate "$data/debian-copyright.parquet" -o "$out/debian-copyright" "${common[@]}" \
  | tee "$out/debian-copyright/summary.txt"
python3 -m gpu_dedup evaluate "$data/debian-licenses.parquet" -o "$out/debian-licenses" "${common[@]}" \
  --label-column label | tee "$out/debian-licenses/summary.txt"
# the labelled set across thresholds (each with its derived layout): ARI against the license names
for t in 0.5 0.6 0.7 0.9; do
  python3 -m gpu_dedup evaluate "$data/debian-licenses.parquet" -o "$out/debian-licenses-sweep/t$t" \
    --sample 0 --id-column id --backend cpu --label-column label --threshold "$t" --no-plot -q > /dev/null
done
mkdir -p "$out/tune"
python3 -m gpu_dedup tune -o "$out/tune" --sample "$data/debian-man.parquet" --id-column id --backend cpu \
  --sample-size 10000 --confirm 3 -q | tee "$out/tune/summary.txt"
