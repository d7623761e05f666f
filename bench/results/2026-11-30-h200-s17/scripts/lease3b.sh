export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/fc
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l3b; mkdir -p $L
cd $S/v2
export PYTHONPATH=$S/v2:$S/abm:$PYTHONPATH
timeout 300 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json > $L/ab90.log 2>&1; ts "ab90 rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -40
timeout 240 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab80.json --kernel sm80 --seqlen 4k,16k > $L/ab80.log 2>&1; ts "ab80 rc=$?"
grep -v "Warn\|exe_args" $L/ab80.log | tail -28
cd $L && tar czf $FIN/l3b.tgz *.log *.json
