# lease 2 (s26): 0ce18a9 (sm80 D=128 one stage without a mask; sm90 empty rows at D=64 under a mask): sm90 D=256 tile/turns
# sweep with the kept-max step, then the sm80 forward GPU tests
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s26
mkdir -p $OUT/r
for dt in bfloat16 float16; do
  timeout 200 python3 -P scripts/tune.py --kernel sm90 --headdim 256 --seqlen 1024,4096,16384 --dtype $dt --rounds 3 > $OUT/r/tune256-$dt.log 2>&1; ts "tune $dt rc=$?"
done
timeout $(( 570 - ($(date +%s) - t0) )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm80" -x > $OUT/r/test80.log 2>&1; ts "tests80 rc=$?: $(tail -1 $OUT/r/test80.log)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/r/gpu.txt
cd $OUT && tar czf r2.tgz r && rm -rf r
ts done
