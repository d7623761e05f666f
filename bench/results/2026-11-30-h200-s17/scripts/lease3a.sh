export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/fc
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l3; mkdir -p $L
( cd $S && env PYTHONPATH=$S/abm:$PYTHONPATH python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 5 > $L/pw-base90.log 2>&1
  env PYTHONPATH=$S/abm:$PYTHONPATH python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 5 > $L/pw-base80.log 2>&1 ) &
cd $S/v2
export PYTHONPATH=$S/v2:$PYTHONPATH
SKIP_BENCH=1 timeout 420 bash scripts/gpu_suite.sh $L/suite > $L/suite.log 2>&1; ts "suite rc=$?"; tail -3 $L/suite.log
wait; ts prewarm-base; tail -1 $L/pw-base90.log $L/pw-base80.log
for c in "128 16384 0 bfloat16" "128 4096 0 bfloat16" "64 16384 0 bfloat16" "128 16384 0 float16"; do
  for tag in tt tt2; do TT_TREE=$S/$tag TT_TAG=-$tag OUT=$L timeout 100 python3 -P $S/tiletl.py ours $c > $L/tl-$tag-${c// /-}.log 2>&1; echo "$tag: $(grep -v 'Warn\|exe_args' $L/tl-$tag-${c// /-}.log | head -2 | tr '\n' ' ')"; done
done
ts tiles
cd $L && tar czf $FIN/l3.tgz *.log suite/*.log suite/*.txt *.pt
