export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s20; L=/tmp/l5; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $L/gpu.txt
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 16 > $L/pc.log 2>&1; ts "pc80 rc=$?"
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 16 >> $L/pc.log 2>&1; ts "pc90 rc=$?"; cat $L/pc.log | grep variants
for seed in 21 22 23 24; do
  FLASHCUTE_TEST_SEED=$seed timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "random_cases and sm80" > $L/seed$seed.log 2>&1; ts "seed $seed rc=$?: $(tail -1 $L/seed$seed.log)"
done
timeout 330 python3 -m flashcute.bench --out $L/bench --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $L/bench.log 2>&1; ts "bench rc=$?"; tail -5 $L/bench.log
timeout 90 python3 -P $S/tune_s.py --kernel sm80 --headdim 64 --seqlen 4096,16384 --causal yes --dtype float16 --rounds 4 2>/dev/null > $L/tune64.log; ts "tune rc=$?"; python3 $S/show.py $L/tune64.log
cd $L && tar czf $OUT/l5.tgz *.log gpu.txt bench 2>/dev/null
