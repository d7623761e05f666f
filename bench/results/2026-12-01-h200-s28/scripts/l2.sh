# lease 2 (call B, after install.sh b, env.sh): the GPU suite (with compute-sanitizer) and the bench on main
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=/tmp/scratch/s28
SANITIZE=1 FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 560 bash scripts/gpu_suite.sh $OUT/suite -- --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/suite.log 2>&1; ts "suite rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/suite/gpu.txt
grep -v "Warn\|exe_args" $OUT/suite.log | grep -v "^|" | tail -8
tar xzf $OUT/suite/bench.tar.gz -O bench/results.md > /dev/null 2>&1 || true
python3 $S/t6.py $OUT/suite/bench.log | tail -13
cd $OUT && tar czf s.tgz suite suite.log && rm -rf suite suite.log
ts done
