# lease 3 (s23): the rotated Hopper step (branch sm90-depbar): pre-compile, A/B against 0098ab0 in one process, GPU tests
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s23
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 250 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 8 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
wait; ts "$(tail -2 $OUT/r/pc-base.log)"
timeout 200 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab.json --kernel sm90 --rounds 5 --headdim 64,128,256 --seqlen 1k,4k,16k > $OUT/r/ab.log 2>&1; ts "ab rc=$?"
cat $OUT/r/ab.log | grep -v "^\s*$" | tail -40
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k "sm90" > $OUT/r/test.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test.log)"
cd $OUT && tar czf r.tgz r && rm -rf r
ts done
