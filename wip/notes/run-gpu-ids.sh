#!/usr/bin/env bash
# Run the GPU test ids in file $1 in 12 concurrent shards (pytest -m gpu); summary in
# $OUT/$2.txt, every shard's log in $OUT/$2_full.log. Run from the repository root on the device.
set -u
ids_file=$1 label=$2
out="${OUT:-/tmp}"
echo "$(wc -l < "$ids_file") ids"
shuf --random-source=<(yes) "$ids_file" > "/tmp/$label-shuf.txt"
split -n l/12 -d "/tmp/$label-shuf.txt" "/tmp/$label-shard"
for f in /tmp/"$label"-shard[0-9]*; do
  mapfile -t ids < "$f"
  timeout -s INT "${TL:-480}" python -m pytest -m gpu -q -p no:cacheprovider --tb=short \
    "${ids[@]}" > "$f.log" 2>&1 &
done
wait
for f in /tmp/"$label"-shard[0-9]*.log; do
  grep -E "passed|failed|error" "$f" | tail -1; grep -E "^FAILED|^ERROR" "$f" | head
done | tee "$out/$label.txt"
cat /tmp/"$label"-shard[0-9]*.log > "$out/${label}_full.log"
