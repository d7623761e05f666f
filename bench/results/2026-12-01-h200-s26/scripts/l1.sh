# lease 1 (s26): branch sm90-empty-rows (kept max under a mask at every head dim; rows at -inf keep m = 0): pre-compile,
# sm90 GPU tests + the new test on both kernels, A/B against main 43f622c (causal), sm80 D=128 tile sweep
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s26
mkdir -p $OUT/r
(PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 4 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 12 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
wait; ts "$(tail -2 $OUT/r/pc-base.log)"
(timeout 300 python3 -P $S/pc_tune.py 128 8 > $OUT/r/pc-tune.log 2>&1; echo "rc=$?" >> $OUT/r/pc-tune.log) &
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm90 or rows_that_reach" > $OUT/r/test90.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test90.log)"
wait; ts "pc-tune $(tail -2 $OUT/r/pc-tune.log | tr '\n' ' ')"
timeout 120 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab.json --kernel sm90 --rounds 4 --headdim 64,128,192,256 --seqlen 1k,4k,16k --causal yes > $OUT/r/ab.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab.log | tail -30
for dt in bfloat16 float16; do
  timeout 150 python3 -P scripts/tune.py --kernel sm80 --headdim 128 --seqlen 4096,16384 --dtype $dt --rounds 3 > $OUT/r/tune128-$dt.log 2>&1; ts "tune $dt rc=$?"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/r/gpu.txt
cd $OUT && tar czf r1.tgz r && rm -rf r
ts done
