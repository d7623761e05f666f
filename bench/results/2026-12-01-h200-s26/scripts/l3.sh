# lease 3 (s26): the GPU suite (with compute-sanitizer) and the bench on the branch's final kernels
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s26
SANITIZE=1 FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 545 bash scripts/gpu_suite.sh $OUT/suite -- --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/suite.log 2>&1; ts "suite rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/suite/gpu.txt
grep -v "Warn\|exe_args" $OUT/suite.log | grep -v "^|" | tail -8
cd $OUT && tar czf s.tgz suite suite.log && rm -rf suite suite.log
ts done
