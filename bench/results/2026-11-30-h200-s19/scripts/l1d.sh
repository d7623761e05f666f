export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l1; mkdir -p $L
timeout 560 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90b.json --kernel sm90 --rounds 8 --headdim 128,256 > $L/ab90b.log 2>&1; ts "ab90 rc=$?"
grep -v "Warn\|exe_args" $L/ab90b.log | tail -26
cd $L && tar czf $OUT/l1d.tgz ab90b.*
