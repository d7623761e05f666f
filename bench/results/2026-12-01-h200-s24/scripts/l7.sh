# lease 7 (s24): sm80 D=128, the row max in 1 or 2 chains x eager/lazy (tune_chains.py); GPU tests (branch: 2 chains at D=128)
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s24
mkdir -p $OUT/r
(timeout 200 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 6 > $OUT/r/pc80.log 2>&1 &)
for dt in float16 bfloat16; do
  timeout 220 python3 -P $S/tune_chains.py --kernel sm80 --headdim 128 --seqlen 4096,16384 --causal no,yes --rounds 4 --dtype $dt > $OUT/r/tune_$dt.log 2>&1; ts "tune $dt rc=$?"
  grep "^{" $OUT/r/tune_$dt.log | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); ref=r['sdpa_flash']
    print(r['dtype'],r['causal'],r['seqlen'],'sdpa',ref,' '.join(f\"{k.split(',')[4].strip()[1]}{k.split(',')[5].strip(' )')}:{v}({v/ref:.3f})\" for k,v in r.items() if k.startswith('(')))"
done
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fwd.py -k "sm80 and (head_dims or row_max or seqlens)" > $OUT/r/test80.log 2>&1; ts "tests rc=$?: $(tail -1 $OUT/r/test80.log)"
cd $OUT && tar czf r7.tgz r && rm -rf r
ts done
