export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s19; L=/tmp/l3; mkdir -p $L
for dt in bfloat16 float16; do
  timeout 270 python3 -P $S/tune_rul.py --kernel sm80 --headdim 128 --seqlen 4096,16384 --dtype $dt --rounds 3 >> $L/tune.jsonl 2>> $L/tune.err; ts "tune $dt rc=$?"
done
python3 - $L/tune.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keys = [k for k in r if k.startswith("(")]
    base = r["(128, 64, 4, 2)"]
    print(r["dtype"], r["headdim"], "causal" if r["causal"] else "nc", r["seqlen"], "sdpa", round(r["sdpa_flash"]), "base", round(base), f"base/sdpa {base/r['sdpa_flash']:.3f}", " ".join(f"{k[-3:-1]}:{r[k]/base:.3f}" for k in keys[1:]), f"best/sdpa {max(r[k] for k in keys)/r['sdpa_flash']:.3f}")
PY
cd $L && tar czf $OUT/l3.tgz tune.*
