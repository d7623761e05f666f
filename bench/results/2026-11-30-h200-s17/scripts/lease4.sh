export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/fc
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l4; mkdir -p $L
cd $S && python3 mkvariants.py $root
XS="a b c d e f g"
for shape in "128 16384 0 bfloat16" "128 4096 0 bfloat16"; do
  for x in $XS; do TT_TREE=$S/tt_$x TT_TAG=-$x TT_LOCK=/tmp/gpu.lock OUT=$L timeout 200 python3 -P $S/tiletl.py ours $shape > $L/tl-$x-${shape// /-}.log 2>&1 & done
  wait
  for x in $XS; do echo "$x ${shape}: $(grep -o 'tile cycles: median [0-9]*' $L/tl-$x-${shape// /-}.log) $(grep -o 'SM clock median [0-9]* MHz' $L/tl-$x-${shape// /-}.log)"; done
  ts "tiles $shape"
done
best=$(for x in $XS; do echo "$(grep -o 'tile cycles: median [0-9]*' $L/tl-$x-128-16384-0-bfloat16.log | awk '{print $4}') $x"; done | sort -n | head -1)
ctrl=$(grep -o 'tile cycles: median [0-9]*' $L/tl-a-128-16384-0-bfloat16.log | awk '{print $4}')
bx=${best#* }; bc=${best% *}
echo "best $bx $bc control $ctrl"
if [ -n "$bc" ] && [ "$bx" != a ] && [ $(( bc * 1000 / ctrl )) -lt 985 ]; then
  ( cd $S/v_$bx && PYTHONPATH=$S/v_$bx:$PYTHONPATH python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pw-$bx.log 2>&1 ) &
  ( cd $S && PYTHONPATH=$S/abm:$PYTHONPATH python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pw-base.log 2>&1 ) &
  wait; ts prewarm
  cd $S/v_$bx && PYTHONPATH=$S/v_$bx:$S/abm:$PYTHONPATH timeout 250 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab-$bx.json > $L/ab-$bx.log 2>&1; ts "ab rc=$?"
  grep -v "Warn\|exe_args" $L/ab-$bx.log | tail -38
fi
cd $L && tar czf $FIN/l4.tgz *.log *.json 2>/dev/null
