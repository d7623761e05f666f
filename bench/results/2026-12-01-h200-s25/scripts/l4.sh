# lease 4 (s25): the GPU suite (with compute-sanitizer) and the bench on branch sm90-kept-max 7f1c05a; then an A/B at D=32 against main
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s25
mkdir -p $OUT/r
(sleep 160; PYTHONPATH=$S/ab:$PYTHONPATH timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 4 > $OUT/r/pc-base.log 2>&1; echo "base pc rc=$?" >> $OUT/r/pc-base.log) &
SANITIZE=1 FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 480 bash scripts/gpu_suite.sh $OUT/suite -- --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/suite.log 2>&1; ts "suite rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/suite/gpu.txt
grep -v "Warn\|exe_args" $OUT/suite.log | tail -4
wait; ts "$(tail -2 $OUT/r/pc-base.log)"
timeout 80 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/r/ab32.json --kernel sm90 --rounds 4 --headdim 32 --seqlen 1k,4k,16k > $OUT/r/ab32.log 2>&1; ts "ab rc=$?"
grep -v "Warn\|exe_args" $OUT/r/ab32.log | tail -14
cd $OUT && tar czf s.tgz suite suite.log r && rm -rf suite suite.log r
ts done
