export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l1; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv
(PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 8 > $L/pc-base.log 2>&1; echo "[pc base rc=$?]") &
timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --jobs 8 > $L/pc.log 2>&1; ts "pc rc=$?"
wait; ts "pc both"
timeout 330 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k sm90 > $L/pytest.log 2>&1; ts "pytest rc=$?"; tail -2 $L/pytest.log
cd $L && tar czf $OUT/l1b.tgz *.log
