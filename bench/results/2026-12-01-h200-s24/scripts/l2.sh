# lease 2 (s24, same host): sm80 pre-compile both trees, A/B of the sm80 forward, GPU tests of the forwards on the branch
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s24
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 150 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 6 > $OUT/r/pc80-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc80-base.log) &
timeout 150 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 10 > $OUT/r/pc80.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc80.log)"
wait; ts "$(tail -1 $OUT/r/pc80-base.log)"
timeout 200 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab80.json --kernel sm80 --rounds 5 --headdim 64,128,256 --seqlen 4k,16k > $OUT/r/ab80.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab80.log | tail -30
timeout 180 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k "row_max_that_moves or head_dims or seqlens_and" > $OUT/r/test.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test.log)"
cd $OUT && tar czf r2.tgz r && rm -rf r
ts done
