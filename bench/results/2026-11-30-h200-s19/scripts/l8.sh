export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l8; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P $S/pc256.py flashcute_base > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
(cd $S/d256s2 && PYTHONPATH=$SITE:$S/d256s2 timeout 200 python3 -P $S/pc256.py flashcute > $L/pc.log 2>&1; echo "[pc new rc=$?]")
wait; ts "pc both"
cd $S/d256s2 && PYTHONPATH=$SITE:$S/d256s2 timeout 200 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab80.json --kernel sm80 --headdim 256 --seqlen 4k,16k --rounds 6 > $L/ab80.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $L/ab80.log | tail -10
cd $L && tar czf $OUT/l8.tgz *.log *.json
