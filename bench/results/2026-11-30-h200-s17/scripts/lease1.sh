export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/fc
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD
S=$root/.scratch/s17
FIN=$OUT; export OUT=/tmp/l1; mkdir -p $OUT
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi0.txt
cd $S/tr
export PYTHONPATH=$S/tr:$PYTHONPATH
cfgs="128:0:bfloat16 128:1:bfloat16 64:0:bfloat16 256:0:float16 256:0:bfloat16"
( for c in $cfgs; do IFS=: read d cz dt <<< "$c"; python3 -P precompile.py $d $cz $dt; done ) > $OUT/precompile.log 2>&1 &
pc=$!
# fa4 timelines (their own compile, GPU briefly) while ours compile
for c in $cfgs; do IFS=: read d cz dt <<< "$c"; cflag=""; [ $cz = 1 ] && cflag=--causal
  timeout 120 python3 -P $S/fa4timeline.py --headdim $d --seqlen 16384 $cflag --dtype $dt --steps 120 --window 6 > $OUT/fa4-$d-$cz-$dt.log 2>&1; ts "fa4 $c rc=$?"
done
wait $pc; ts "precompile done"; tail -1 $OUT/precompile.log
for c in $cfgs; do IFS=: read d cz dt <<< "$c"; cflag=""; [ $cz = 1 ] && cflag=--causal
  timeout 120 python3 -P scripts/step_timeline.py --headdim $d --seqlen 16384 $cflag --dtype $dt --steps 256 --window 6 > $OUT/ours-$d-$cz-$dt.log 2>&1; ts "ours $c rc=$?"
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi1.txt
cd $OUT && tar czf $FIN/logs.tgz *.log *.pt *.txt 2>/dev/null; for f in ours-128-0-bfloat16 fa4-128-0-bfloat16 ours-128-1-bfloat16 fa4-128-1-bfloat16 ours-256-0-float16 fa4-256-0-float16 ours-64-0-bfloat16 fa4-64-0-bfloat16; do echo "== $f"; grep -v "Warn\|exe_args" $f.log | grep "warpgroup\|Error\|error" | head -5; done
