export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l4; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
(cd $S/swap && PYTHONPATH=$SITE:$S/swap timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pc.log 2>&1; echo "[pc swap rc=$?]")
wait; ts "pc both"
cd $S/swap && PYTHONPATH=$SITE:$S/swap timeout 300 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab.json --kernel sm90 --rounds 6 --headdim 64,128 > $L/ab.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $L/ab.log | tail -26
cd $L && tar czf $OUT/l4.tgz *.log *.json
