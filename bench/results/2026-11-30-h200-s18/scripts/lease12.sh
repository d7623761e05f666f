export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
FIN=$OUT; L=/tmp/l12; mkdir -p $L
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_power_loop.py > $L/pytest.log 2>&1; ts "pytest rc=$?"; tail -1 $L/pytest.log
timeout 120 python3 -P scripts/power_loop.py --backends flashcute-sm90,fa4 --headdim 128 --seqlen 16384 --causal no --dtype fp16 --seconds 3 --repeats 2 --out $L/power.json > $L/power.log 2>&1; ts "power rc=$?"
grep -v "Warn\|exe_args" $L/power.log | tail -6
cd $L && tar czf $FIN/l12.tgz *.log *.json
