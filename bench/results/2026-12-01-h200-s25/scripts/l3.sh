# lease 3 (s25): branch sm90-kept-max (no early rescale in kept-max steps) against main: A/B at D=96,192,256
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s25
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 5 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 250 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 11 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
wait; ts "$(tail -2 $OUT/r/pc-base.log)"
timeout 100 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k "sm90" > $OUT/r/test90.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test90.log)"
timeout 240 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab90.json --kernel sm90 --rounds 4 --headdim 96,192,256 --seqlen 1k,4k,16k > $OUT/r/ab90.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab90.log | tail -40
cd $OUT && tar czf r3.tgz r && rm -rf r
ts done
