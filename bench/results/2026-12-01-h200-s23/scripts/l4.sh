# lease 4 (s23): the GPU suite and the bench on main (kernels as at a9204d6; sass.py reads CUDA 13 cubins)
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
FLASHCUTE_GIT_COMMIT=$(cat .scratch/s23/commit) timeout 560 bash scripts/gpu_suite.sh $OUT/suite -- --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/suite.log 2>&1; ts "suite rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/suite/gpu.txt
tail -12 $OUT/suite.log
cd $OUT && tar czf s.tgz suite suite.log && rm -rf suite suite.log
ts done
