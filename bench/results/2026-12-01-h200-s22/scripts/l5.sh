# lease 5: sm80 D=256 tiles against the walk's length (causal and not, 1k..16k); energy of sm80 bf16/fp16 D=128
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s22
for dt in bfloat16 float16; do
  timeout 200 python3 -P $S/tune_s.py --kernel sm80 --headdim 256 --seqlen 1024,2048,4096,8192,16384 --causal no,yes --dtype $dt --rounds 4 > $OUT/tune_$dt.log 2>$OUT/tune_$dt.err; ts "tune $dt rc=$?"
done
timeout 150 python3 -P scripts/power_loop.py --backends flashcute-sm80,sdpa-flash --headdim 128 --seqlen 16384 --causal no --dtype both --seconds 3 --repeats 2 --out $OUT/power.json > $OUT/power.log 2>&1; ts "power rc=$?"; tail -12 $OUT/power.log
python3 - $OUT/tune_bfloat16.log $OUT/tune_float16.log <<'PY'
import json, sys
for f in sys.argv[1:]:
    for line in open(f):
        if line.startswith("{"):
            r = json.loads(line)
            c = {k: v for k, v in r.items() if k.startswith("(")}
            print(r["dtype"][:4], r["causal"], r["seqlen"], "sdpa", r["sdpa_flash"], " ".join(f"{k}={v}" for k, v in c.items()))
PY
