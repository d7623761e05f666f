export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l6; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/mc; export PYTHONPATH=$SITE:$PWD
timeout 120 python3 -P sanity.py > $L/sanity.log 2>&1; ts "sanity rc=$?"; grep -v "Warn\|exe_args" $L/sanity.log | tail -6
python3 -P -m flashcute.kernels.variants --arch sm_90a --jobs 16 > $L/compile.log 2>&1; ts "compile rc=$?"; tail -2 $L/compile.log
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k sm90 > $L/fwd90.log 2>&1; ts "fwd90 rc=$?"; tail -3 $L/fwd90.log
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/test_fwd.py > $L/rest.log 2>&1; ts "rest rc=$?"; tail -3 $L/rest.log
cd $L && tar czf $FIN/l6.tgz *.log
