export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l6; mkdir -p $L
timeout 250 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json --kernel sm90 --rounds 5 > $L/ab90.log 2>&1; ts "ab90 rc=$?"
timeout 250 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab80.json --kernel sm80 --seqlen 4k,16k --rounds 5 > $L/ab80.log 2>&1; ts "ab80 rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -37; grep -v "Warn\|exe_args" $L/ab80.log | tail -25
cd $L && tar czf $OUT/l6.tgz ab*
