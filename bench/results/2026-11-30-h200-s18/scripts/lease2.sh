export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l2; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
V=(--variant base={} --variant n144='{"block_n": 144}' --variant n160='{"block_n": 160}' --variant n176='{"block_n": 176}' --variant n176o4='{"block_n": 176, "sum_chains": 4, "turn_before_k": false, "pass_turn_after_qk": false}')
(timeout 400 python3 -P scripts/tile_cycles.py --headdim 128 --seqlen 4096,16384 --causal no,yes --dtype bfloat16,float16 "${V[@]}" --out $L/bn128.json > $L/bn128.log 2>&1; ts "bn128 rc=$?") &
(timeout 400 python3 -P scripts/tile_cycles.py --headdim 64 --seqlen 16384 --causal no,yes --dtype bfloat16,float16 "${V[@]:0:8}" --out $L/bn64.json > $L/bn64.log 2>&1; ts "bn64 rc=$?") &
(cd $S/s80 && PYTHONPATH=$SITE:$PWD timeout 300 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 8 > $L/pc-new.log 2>&1; ts "pc new rc=$?") &
(cd $S/s80 && PYTHONPATH=$SITE:$S/abm timeout 300 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 8 > $L/pc-base.log 2>&1; ts "pc base rc=$?") &
wait; ts "phase 1 done"
tail -3 $L/pc-*.log
for f in $L/bn128.log $L/bn64.log; do echo "== $f"; grep -v "Warn\|exe_args" $f | tail -12; done
(cd $S/s80 && PYTHONPATH=$SITE:$PWD timeout 330 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab80.json --kernel sm80 --headdim 64,128 --seqlen 4k,16k > $L/ab80.log 2>&1; ts "ab80 rc=$?")
grep -v "Warn\|exe_args" $L/ab80.log | tail -24
cd $L && tar czf $FIN/l2.tgz *.log *.json
