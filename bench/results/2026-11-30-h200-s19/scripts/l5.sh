export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l5; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/abm timeout 300 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 4 > $L/pc-base.log 2>&1; PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only fwd --exact-only --jobs 4 >> $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
FLASHCUTE_GIT_COMMIT=011456c SKIP_BENCH=1 timeout 480 bash scripts/gpu_suite.sh $L/suite > $L/suite.log 2>&1; ts "suite rc=$?"; tail -3 $L/suite.log
wait
cd $L && tar czf $OUT/l5.tgz suite.log suite/*.log suite/gpu.txt pc-base.log
