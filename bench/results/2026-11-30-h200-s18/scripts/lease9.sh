export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l9; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/mc; export PYTHONPATH=$SITE:$PWD
for dt in bfloat16 float16; do
  timeout 250 python3 -P scripts/tune.py --kernel sm90 --headdim 64,128,256 --seqlen 4096,16384 --causal no --dtype $dt --rounds 5 >> $L/tune.jsonl 2>> $L/tune.err; ts "tune $dt rc=$?"
done
python3 - $L/tune.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keys = [k for k in r if k.startswith("(")]
    vals = {k.split(",")[-1].strip(" ')"): r[k] for k in keys}
    errs = max(v for k, v in r.items() if k.startswith("error"))
    c = vals["claim"]
    print(f"{r['dtype']:9} D{r['headdim']:<4} L{r['seqlen']:<6} fa4 {r.get('fa4', 0):6.1f} claim {c:6.1f} fixed {vals['fixed']:6.1f} ({vals['fixed']/c:.3f}) mcast {vals['mcast']:6.1f} ({vals['mcast']/c:.3f}) mcast/fixed {vals['mcast']/vals['fixed']:.3f} claim/fa4 {c/r.get('fa4', 1):.3f} maxerr {errs:.1e}")
PY
cd $L && tar czf $FIN/l9.tgz tune.jsonl tune.err
