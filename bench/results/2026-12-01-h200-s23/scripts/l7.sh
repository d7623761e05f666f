# lease 7 (s23): sm80 tiles at D=256 and D=96 re-timed with the balanced round order
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s23
mkdir -p $OUT/r
for dt in float16 bfloat16; do
  timeout 240 python3 -P $S/tune_x.py --kernel sm80 --headdim 256,96 --seqlen 4096,16384 --causal no,yes --dtype $dt --rounds 4 > $OUT/r/tune_$dt.log 2>$OUT/r/tune_$dt.err; ts "tune $dt rc=$?"
done
python3 - $OUT/r/tune_float16.log $OUT/r/tune_bfloat16.log <<'PY'
import json, sys
for f in sys.argv[1:]:
    for line in open(f):
        if line.startswith("{"):
            r = json.loads(line)
            c = {k: v for k, v in r.items() if k.startswith("(")}
            print(r["dtype"][:4], r["headdim"], r["causal"], r["seqlen"], "sdpa", r.get("sdpa_flash"), " ".join(f"{k}={v}" for k, v in c.items()))
PY
cd $OUT && tar czf r.tgz r && rm -rf r
ts done
