# lease 1, call B (after install.sh b, env.sh): bench of main (sm90 + fa4) and A/B/C experiments
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=/tmp/scratch/s28
ls $FLASHCUTE_CACHE_DIR | wc -l
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 200 python3 -m flashcute.bench --out $OUT/bench --seqlen 1k,4k,16k --backends flashcute-sm90,fa4 --rounds 5 > $OUT/bench.log 2>&1; ts "bench rc=$?"
timeout 130 python3 -P $S/ab3.py 5 256 4096,16384,1024 no exp_in_place=1 > $OUT/ab_nc256.log 2>&1; ts "ab nc256 rc=$?"
timeout 110 python3 -P $S/ab3.py 5 192 4096,16384,1024 yes exp_in_place=1 > $OUT/ab_c192.log 2>&1; ts "ab c192 rc=$?"
timeout 60 python3 -P scripts/power_loop.py --backends flashcute-sm90,fa4 --headdim 256 --seqlen 16384 --causal no,yes --dtype fp16 --seconds 3 --repeats 2 --out $OUT/power.json > $OUT/power.log 2>&1; ts "power rc=$?"
ls $FLASHCUTE_CACHE_DIR | wc -l
python3 $S/t6.py $OUT/bench.log | tee $OUT/t6.md
cut -c1-230 $OUT/ab_nc256.log $OUT/ab_c192.log | grep -v Warn
tail -8 $OUT/power.log
ts done
