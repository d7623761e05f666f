# lease 1 (s24): branch lazy-rescale against main: pre-compile both trees (sm90 and sm80 forwards), A/B of the Hopper forward
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s24
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 6 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 250 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 10 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
(timeout 300 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 4 > $OUT/r/pc80.log 2>&1 &)
wait; ts "$(tail -1 $OUT/r/pc-base.log)"
timeout 260 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab90.json --kernel sm90 --rounds 5 --headdim 64,128,256 --seqlen 1k,4k,16k > $OUT/r/ab90.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab90.log | tail -44
cd $OUT && tar czf r1.tgz r && rm -rf r
ts done
