export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s20; L=/tmp/l2; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/ab timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 4 > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
timeout 240 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 12 > $L/pc-new.log 2>&1; ts "pc new rc=$?"; tail -2 $L/pc-new.log
wait
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k sm80 > $L/test.log 2>&1; ts "tests rc=$?"; tail -4 $L/test.log
timeout 120 python3 -P scripts/ab_inprocess.py run $S/ab $L/ab.json --kernel sm80 --headdim 256,192 --seqlen 4k,16k --rounds 5 > $L/ab.log 2>&1; ts "ab rc=$?"; tail -20 $L/ab.log
timeout 150 python3 -P $S/tune_s.py --kernel sm80 --headdim 128,256 --seqlen 4096,16384 --rounds 4 > $L/tune.log 2>&1; ts "tune rc=$?"; cat $L/tune.log | cut -c1-400
cd $L && tar czf $OUT/l2.tgz *.log *.json 2>/dev/null
