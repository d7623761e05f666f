export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l2; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 8 > $L/pc.log 2>&1; ts "pc rc=$?"
wait; ts "pc both"
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k sm90 > $L/pytest.log 2>&1; ts "pytest rc=$?"; tail -1 $L/pytest.log
timeout 300 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab.json --kernel sm90 --rounds 6 --headdim 192,256 > $L/ab.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $L/ab.log | tail -26
cd $L && tar czf $OUT/l2.tgz *.log *.json
