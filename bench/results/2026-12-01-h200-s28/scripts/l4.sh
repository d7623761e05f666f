# lease 4 (call B, after install.sh b, env.sh): head dim 160 (the 192 bucket padded, in place under a mask) and the
# random cases on both kernels (and two other seeds of them); exp_in_place at D=64 and D=128 against the
# heuristic (scripts/tune.py --against), flash-attn-4 and SDPA flash beside
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=/tmp/scratch/s28  # .scratch/s28 carried by install.sh a's call (this folder's scripts)
ls $FLASHCUTE_CACHE_DIR | wc -l
timeout 120 python3 -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --only sm80-fwd --jobs 16 > $OUT/compile.log 2>&1; ts "compile rc=$?"
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "(head_dims and 160) or random_cases" > $OUT/t160.log 2>&1; ts "tests rc=$?"
for seed in 7 8; do
  FLASHCUTE_TEST_SEED=$seed timeout 50 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k random_cases > $OUT/seed$seed.log 2>&1; ts "seed $seed rc=$?"
done
for dt in bfloat16 float16; do
  timeout 120 python3 -P scripts/tune.py --kernel sm90 --headdim 64,128 --seqlen 1024,4096,16384 --dtype $dt --rounds 5 --against exp_in_place=1 > $OUT/ab_ip_$dt.log 2>&1; ts "ab $dt rc=$?"
done
ls $FLASHCUTE_CACHE_DIR | wc -l
tail -2 $OUT/compile.log; tail -3 $OUT/t160.log $OUT/seed7.log $OUT/seed8.log
cat $OUT/ab_ip_*.log | grep "^{" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['dtype'][:4], r['headdim'], 'c' if r['causal'] else 'n', r['seqlen'], r['heuristic'], r['against'], r.get('fa4'), r['against/heuristic'], round(r['heuristic'] / r['fa4'], 3), round(r['against'] / r['fa4'], 3))
"
ts done
