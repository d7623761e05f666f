export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l4; mkdir -p $L
timeout 200 python3 -P scripts/tile_cycles.py --headdim 128 --seqlen 16384 --causal no --dtype bfloat16,float16 --out $L/ours.json > $L/ours.log 2>&1; ts "ours tc rc=$?"
grep -v "Warn\|exe_args" $L/ours.log | tail -4
for dt in bfloat16 float16; do OUT=$L timeout 200 python3 -P $S/tiletl.py fa4 128 16384 0 $dt > $L/fa4-$dt.log 2>&1; ts "fa4 $dt rc=$?"; grep -v "Warn\|exe_args" $L/fa4-$dt.log | head -3; done
for shape in "128 16384 0 bfloat16" "128 16384 0 float16" "256 16384 0 float16" "64 16384 0 bfloat16"; do
  timeout 120 python3 -P $S/power.py $shape 3 > $L/pw-${shape// /-}.log 2>&1; ts "power $shape rc=$?"; grep -v "Warn\|exe_args" $L/pw-${shape// /-}.log | tail -5
done
nvidia-smi -q -d POWER | head -40 > $L/smi-power.txt; cat $L/smi-power.txt | grep -i "limit\|draw" | head
cd $L && tar czf $FIN/l4.tgz *.log *.json *.txt
