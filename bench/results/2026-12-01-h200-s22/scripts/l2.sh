# lease script 2: branch sm80-stage-and: sm80 GPU tests, then one-process A/B against main
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s22; SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/brtree; export PYTHONPATH=$SITE:$S/brtree
python3 -c "import flashcute; print(flashcute.__file__)"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k sm80 -x > $OUT/br-tests.log 2>&1; ts "branch tests rc=$?"; tail -3 $OUT/br-tests.log
timeout 200 python3 -P scripts/ab_inprocess.py run $S/ab $OUT/ab.json --kernel sm80 --headdim 64,128,256 --seqlen 4k,16k --rounds 5 > $OUT/ab.log 2>&1; ts "ab rc=$?"; tail -26 $OUT/ab.log
