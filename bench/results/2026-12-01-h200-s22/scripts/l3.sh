# lease 3: suite + sanitizer on the new main, the backward A/B, the bench
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s22; SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/ab timeout 250 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-bwd --only sm90-fwd --exact-only --jobs 6 > $OUT/pc-base.log 2>&1; echo "[pc base rc=$?] $(tail -1 $OUT/pc-base.log)") &
FLASHCUTE_GIT_COMMIT=$COMMIT SANITIZE=1 SKIP_BENCH=1 timeout 330 bash scripts/gpu_suite.sh $OUT/suite > $OUT/suite.log 2>&1; ts "suite rc=$?"
tail -9 $OUT/suite.log; grep -E "FAILED|Error" $OUT/suite/pytest.log | head -20
wait
timeout 80 python3 -P $S/ab_bwd.py $S/ab > $OUT/ab_bwd.log 2>&1; ts "ab bwd rc=$?"; cat $OUT/ab_bwd.log | grep -v Warn
timeout 200 python3 -m flashcute.bench --out $OUT/bench --seqlen 1k,4k,16k --backends flashcute-sm90,flashcute-sm80,fa4,sdpa-flash --rounds 5 > $OUT/bench.log 2>&1; ts "bench rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/suite/gpu.txt
