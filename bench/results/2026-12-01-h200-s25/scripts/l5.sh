# lease 5 (s25): branch sm90-kept-max with uniform K descriptors for bf16 D=256 lazy: pre-compile, sm90 GPU tests, A/B at D=256 against 7f1c05a, the forward bench
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s25
mkdir -p $OUT/r
(PYTHONPATH=$S/ab2:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 4 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 12 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 12 > $OUT/r/pc80.log 2>&1; ts "pc80 rc=$? $(tail -1 $OUT/r/pc80.log)"
wait; ts "$(tail -2 $OUT/r/pc-base.log)"
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm90" > $OUT/r/test90.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test90.log)"
timeout 80 python3 -P scripts/ab_inprocess.py run $S/ab2 $OUT/r/ab256.json --kernel sm90 --rounds 4 --headdim 256 --seqlen 1k,4k,16k --causal no > $OUT/r/ab256.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab256.log | tail -8
FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 200 python3 -m flashcute.bench --out $OUT/r/bench --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/r/bench.log 2>&1; ts "bench rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/r/gpu.txt
cd $OUT && tar czf r5.tgz r && rm -rf r
ts done
