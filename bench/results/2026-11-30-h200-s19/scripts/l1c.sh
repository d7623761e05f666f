export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l1; mkdir -p $L
timeout 560 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json --kernel sm90 --rounds 3 > $L/ab90.log 2>&1; ts "ab90 rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -45
cd $L && tar czf $OUT/l1c.tgz ab90.*
