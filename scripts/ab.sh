#!/usr/bin/env bash
# A/B of two source trees on one GPU host: bench runs in alternating processes, A B A B (AB_ROUNDS=2 pairs).
#
#   bash scripts/ab.sh OUT TREE_A TREE_B [bench args ...]
#
# TREE_A and TREE_B are directories that hold a `flashcute` package (`.` for this checkout, or another checkout
# copied into the working tree so that it travels to the GPU host). Each run imports flashcute from its tree
# (PYTHONPATH; `python3 -P` keeps the current directory's package from shadowing it: without it both trees ran
# this checkout's code) and uses its own compiled kernels (the compile cache keys on the sources), pre-compiled
# first for the exact head dims (AB_ONLY="sm90-fwd ...": only these kernel families, as variants.py --only).
# Writes OUT/ab-{A,B}{1,2,..}.log and OUT/ab.json, and prints, per point, the best of each tree's runs for
# flashcute-sm90 and flash-attn-4 and the ratio B / A. Default bench args: bf16, the forward, every head dim and
# mask, 1k/4k/16k.
set -uo pipefail
out=${1:?usage: ab.sh OUT TREE_A TREE_B [bench args]}
tree_a=${2:?TREE_A}
tree_b=${3:?TREE_B}
shift 3
bench_args=("$@")
[ ${#bench_args[@]} -eq 0 ] && bench_args=(--dtype bf16 --seqlen 1k,4k,16k --backends flashcute-sm90,fa4)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=${FLASHCUTE_CACHE_DIR:-/tmp/flashcute-cache}
only=()
for family in ${AB_ONLY:-}; do only+=(--only "$family"); done
for tree in "$tree_a" "$tree_b"; do
  PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -P -m flashcute.kernels.variants --exact-only \
    "${only[@]}" --jobs "$(nproc)" 2>&1 | tail -n 1
done
runs=()
for round in $(seq 1 "${AB_ROUNDS:-2}"); do runs+=("A$round" "B$round"); done
for run in "${runs[@]}"; do
  tree=$tree_a
  [ "${run:0:1}" = B ] && tree=$tree_b
  PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -P -m flashcute.bench "${bench_args[@]}" --no-check \
    --out "$out/ab-$run" > "$out/ab-$run.log" 2>&1 || echo "run $run failed: $out/ab-$run.log"
done
python3 - "$out" <<'PY'
import json, sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
best = defaultdict(dict)  # point -> {(tree, backend): best TFLOP/s over the tree's runs}
for path in sorted(out.glob("ab-[AB]*/results.json")):
    run = path.parent.name.removeprefix("ab-")
    for row in json.loads(path.read_text())["rows"]:
        if row.get("tflops"):
            point = (row["pass"], row["dtype"], row["headdim"], row["causal"], row["seqlen"])
            key = (run[0], row["backend"])
            best[point][key] = max(best[point].get(key, 0.0), row["tflops"])
rows = []
print("| pass | dtype | D | causal | L | A sm90 | B sm90 | B / A | fa4 (A runs) | fa4 (B runs) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for point, v in sorted(best.items()):
    a, b = v.get(("A", "flashcute-sm90"), 0.0), v.get(("B", "flashcute-sm90"), 0.0)
    fa, fb = v.get(("A", "fa4"), 0.0), v.get(("B", "fa4"), 0.0)
    rows.append({"point": point, "A": a, "B": b, "fa4_A": fa, "fa4_B": fb})
    ratio = f"{b / a:.3f}" if a else "-"
    print(f"| {' | '.join(str(x) for x in point)} | {a:.0f} | {b:.0f} | {ratio} | {fa:.0f} | {fb:.0f} |")
(out / "ab.json").write_text(json.dumps(rows, indent=1))
PY
