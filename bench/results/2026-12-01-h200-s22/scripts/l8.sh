# lease 8: branch sm80-chunked-exp: sm80 forward GPU tests, then one-process A/B against main (d68b2f7)
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s22; SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/ab2 timeout 150 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 5 > $OUT/pc-base.log 2>&1; echo "[pc base rc=$?] $(tail -1 $OUT/pc-base.log)") &
timeout 150 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 11 > $OUT/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/pc.log)"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k sm80 > $OUT/tests.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/tests.log)"
grep -E "^FAILED" $OUT/tests.log | head
wait
timeout 150 python3 -P scripts/ab_inprocess.py run $S/ab2 $OUT/ab.json --kernel sm80 --headdim 64,128,256 --seqlen 4k,16k --rounds 5 > $OUT/ab.log 2>&1; ts "ab rc=$?"; tail -26 $OUT/ab.log
