export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
L=/tmp/l7; mkdir -p $L
FLASHCUTE_GIT_COMMIT=$COMMIT SKIP_BENCH=1 timeout 500 bash scripts/gpu_suite.sh $L/suite > $L/suite.log 2>&1; ts "suite rc=$?"; tail -3 $L/suite.log
cd $L && tar czf $OUT/l7.tgz suite.log suite/*.log suite/gpu.txt
