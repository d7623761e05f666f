export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l10; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/mc; export PYTHONPATH=$SITE:$PWD
timeout 300 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90-d128.json --kernel sm90 --headdim 128 --causal no --rounds 9 > $L/ab90-d128.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $L/ab90-d128.log | tail -8
cd $L && tar czf $FIN/l10.tgz *.log *.json
