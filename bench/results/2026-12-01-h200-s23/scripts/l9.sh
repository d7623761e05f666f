# lease 9 (s23): #3's bench on the final tree (sm80 forward against SDPA flash, 4k and 16k)
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
mkdir -p $OUT/r
timeout 120 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 16 > $OUT/r/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/r/pc.log)"
FLASHCUTE_GIT_COMMIT=$(cat .scratch/s23/commit) timeout 150 python3 -m flashcute.bench --out $OUT/r/bench --seqlen 4k,16k --backends flashcute-sm80,sdpa-flash --rounds 5 > $OUT/r/bench.log 2>&1; ts "bench rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/r/gpu.txt
rm -f $OUT/r/bench/*.png
cd $OUT && tar czf r.tgz r && rm -rf r
ts done
