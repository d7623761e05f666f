export PYTHONUNBUFFERED=1
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD
S=$root/.scratch/s17
FIN=$OUT; export OUT=/tmp/l2; mkdir -p $OUT
for c in "128 16384 0 bfloat16" "128 4096 0 bfloat16" "128 16384 1 bfloat16" "64 16384 0 bfloat16" "256 16384 0 float16" "128 1024 0 bfloat16"; do
  for who in $WHO; do
    timeout 100 python3 -P $S/tiletl.py $who $c > $OUT/tl-$who-${c// /-}.log 2>&1; rc=$?
    grep -v "Warn\|exe_args" $OUT/tl-$who-${c// /-}.log | tail -7; [ $rc = 0 ] || echo "rc=$rc"
  done
done
ts done
cd $OUT && tar czf $FIN/l2.tgz *.log *.pt
