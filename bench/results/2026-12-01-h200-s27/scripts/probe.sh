# one call on the lent H200 (s27): in-place exponentials (Sm90FwdConfig.exp_in_place): GPU tests of its paths, A/B at D=256
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
S=/tmp/scratch
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $OUT/probe.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/probe.log
ts "cache entries: $(ls /tmp/flashcute-cache | wc -l)"
timeout 60 python3 -P $S/precompile.py 16 > $OUT/pc.log 2>&1; ts "pc rc=$? $(tail -1 $OUT/pc.log)"
timeout 70 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k "sm90 and place and (row_max or rows_that_reach)" > $OUT/t.log 2>&1; ts "tests rc=$? $(tail -1 $OUT/t.log)"
grep -E "FAILED|Error" $OUT/t.log | head -5
timeout 90 python3 -P $S/ab.py 3 4096,16384,1024 > $OUT/ab.log 2>&1; ts "ab rc=$?"
grep "^{" $OUT/ab.log
