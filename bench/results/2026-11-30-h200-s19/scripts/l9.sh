export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
L=/tmp/l9; mkdir -p $L
timeout 150 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 16 > $L/pc.log 2>&1; ts "pc rc=$?"
for n in 9 10 11 12 13 14; do
  FLASHCUTE_TEST_SEED=$n timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "random_cases and sm90" > $L/seed$n.log 2>&1; ts "seed $n rc=$? $(tail -1 $L/seed$n.log)"
done
cd $L && tar czf $OUT/l9.tgz *.log
