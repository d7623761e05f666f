# lease script 1: GPU suite + sanitizer on main; branch precompile in the background during the sanitizer
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s22; SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
FLASHCUTE_GIT_COMMIT=${COMMIT:-5d6092b} SKIP_BENCH=1 timeout 300 bash scripts/gpu_suite.sh $OUT/suite > $OUT/suite.log 2>&1; ts "suite rc=$?"
tail -4 $OUT/suite.log; grep -E "FAILED|Error" $OUT/suite/pytest.log | head -20
(cd $S/brtree && PYTHONPATH=$SITE:$S/brtree timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 10 > $OUT/pc-branch.log 2>&1; echo "[pc branch rc=$?]"; tail -1 $OUT/pc-branch.log) &
(PYTHONPATH=$SITE:$S/ab timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 4 > $OUT/pc-base.log 2>&1; echo "[pc base rc=$?]"; tail -1 $OUT/pc-base.log) &
timeout 420 python3 -P scripts/sanitize.py $OUT/sanitize > $OUT/sanitize.log 2>&1; ts "sanitize rc=$?"; tail -8 $OUT/sanitize.log
wait; ts done
