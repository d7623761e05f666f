export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
FIN=$OUT; L=/tmp/l8; mkdir -p $L
python3 -m flashcute.kernels.variants --arch sm_90a --jobs 16 > $L/compile.log 2>&1; ts "compile rc=$?"; tail -1 $L/compile.log
for s in 1 2 3 4 5 6 7 8; do
  FLASHCUTE_TEST_SEED=$s timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py tests/test_bwd.py -k random_cases > $L/seed$s.log 2>&1; ts "seed $s rc=$?: $(tail -1 $L/seed$s.log)"
  grep -E "^FAILED" $L/seed$s.log | head -5
done
cd $L && tar czf $FIN/l8.tgz *.log
