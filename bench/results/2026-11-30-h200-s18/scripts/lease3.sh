export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l3; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/n160
(PYTHONPATH=$SITE:$PWD timeout 300 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 7 > $L/pc-new.log 2>&1; ts "pc new rc=$?") &
(PYTHONPATH=$SITE:$S/abm timeout 300 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 7 > $L/pc-base.log 2>&1; ts "pc base rc=$?") &
(PYTHONPATH=$SITE:$PWD timeout 300 python3 -P scripts/tile_cycles.py --headdim 256 --seqlen 4096,16384 --causal no,yes --dtype bfloat16,float16 --variant base={} --variant n64='{"block_n": 64}' --out $L/d256.json > $L/d256.log 2>&1; ts "d256 rc=$?") &
wait; ts "phase 1 done"
for f in $L/pc-*.log; do tail -n 2 $f; done
grep -v "Warn\|exe_args" $L/d256.log | tail -12
PYTHONPATH=$SITE:$PWD timeout 400 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json --kernel sm90 --headdim 128 > $L/ab90.log 2>&1; ts "ab90 rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -16
cd $L && tar czf $FIN/l3.tgz *.log *.json
