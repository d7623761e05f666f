export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/fc
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l7; mkdir -p $L
( cd $S && env PYTHONPATH=$S/abm:$PYTHONPATH python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 4 > $L/pw-base.log 2>&1 ) &
SKIP_BENCH=1 timeout 400 bash scripts/gpu_suite.sh $L/suite > $L/suite.log 2>&1; ts "suite rc=$?"; tail -3 $L/suite.log
wait; ts prewarm-base
PYTHONPATH=$root:$S/abm:$PYTHONPATH timeout 200 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json > $L/ab90.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -38
cd $L && tar czf $FIN/l7.tgz *.log *.json suite/*.log suite/*.txt suite/*.xml
