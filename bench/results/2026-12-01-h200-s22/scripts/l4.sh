# lease 4: random GPU cases under new seeds (forward and backward, both kernels); tensors past 2**31 elements
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s22
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --jobs 16 > $OUT/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/pc.log)"
for seed in $(seq 41 52); do
  FLASHCUTE_TEST_SEED=$seed timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py tests/test_bwd.py -k random_cases > $OUT/seed$seed.log 2>&1; ts "seed $seed rc=$?: $(tail -1 $OUT/seed$seed.log)"
done
grep -h -E "^FAILED|Error" $OUT/seed*.log | head -20
timeout 150 python3 -P $S/big.py > $OUT/big.log 2>&1; ts "big rc=$?"; tail -8 $OUT/big.log
