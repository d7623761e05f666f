# lease 8 (s23): branch sm80-d256-tile: sm80 forward GPU tests, A/B against main in one process at D=64
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s23
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 6 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 250 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 10 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
wait; ts "$(tail -1 $OUT/r/pc-base.log)"
timeout 150 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab.json --kernel sm80 --rounds 5 --headdim 256 --seqlen 1k,4k,16k > $OUT/r/ab.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab.log | tail -16
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm80" > $OUT/r/test.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test.log)"
cd $OUT && tar czf r.tgz r && rm -rf r
ts done
