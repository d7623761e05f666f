export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s20; L=/tmp/l4; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
(PYTHONPATH=$SITE:$S/ab timeout 300 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm80-fwd --exact-only --jobs 3 > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
FLASHCUTE_GIT_COMMIT=$COMMIT SKIP_BENCH=1 timeout 420 bash scripts/gpu_suite.sh $L/suite > $L/suite.log 2>&1; ts "suite rc=$?"; tail -3 $L/suite.log
wait
timeout 150 python3 -P scripts/ab_inprocess.py run $S/ab $L/ab80.json --kernel sm80 --headdim 64,128,256 --seqlen 4k,16k --rounds 5 > $L/ab80.log 2>&1; ts "ab rc=$?"; tail -26 $L/ab80.log
timeout 120 python3 -P $S/tune_s.py --kernel sm80 --headdim 128 --seqlen 4096,16384 --rounds 4 2>/dev/null > $L/tune128.log; ts "tune rc=$?"; python3 $S/show.py $L/tune128.log
timeout 120 python3 -P $S/tune_s.py --kernel sm80 --headdim 192 --seqlen 4096,16384 --rounds 3 2>/dev/null > $L/tune192.log; ts "tune rc=$?"; python3 $S/show.py $L/tune192.log
timeout 120 python3 -P $S/tune_s.py --kernel sm80 --headdim 256 --seqlen 4096 --causal yes --rounds 4 --dtype float16 2>/dev/null > $L/tune256.log; ts "tune rc=$?"; python3 $S/show.py $L/tune256.log
cd $L && tar czf $OUT/l4.tgz *.log *.json suite/*.log suite/gpu.txt 2>/dev/null
