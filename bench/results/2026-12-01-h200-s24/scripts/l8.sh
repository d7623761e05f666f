# lease 8 (s24): branch sm80-kept-max against main 17f9f65: pre-compile, A/B of the sm80 forward at D=128/256, GPU tests
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s24
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 150 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 5 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 150 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 11 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
wait; ts "$(tail -1 $OUT/r/pc-base.log)"
timeout 120 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab80.json --kernel sm80 --rounds 5 --headdim 128,256 --seqlen 4k,16k > $OUT/r/ab80.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab80.log | tail -18
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm80" > $OUT/r/test80.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test80.log)"
cd $OUT && tar czf r8.tgz r && rm -rf r
ts done
