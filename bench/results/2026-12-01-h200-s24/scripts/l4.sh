# lease 4 (s24): Hopper forward, persistent claimed grid against one thread block a tile (tune_grid.py), non-causal
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s24
mkdir -p $OUT/r
for dt in bfloat16 float16; do
  timeout 250 python3 -P $S/tune_grid.py --kernel sm90 --headdim 64,128,256 --seqlen 4096,16384 --causal no --rounds 4 --dtype $dt > $OUT/r/grid_$dt.log 2>&1; ts "tune $dt rc=$?"
  grep "^{" $OUT/r/grid_$dt.log | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); ref=r.get('fa4')
    print(r['dtype'],r['headdim'],r['causal'],r['seqlen'],'fa4',ref,' '.join(f\"{k.split(',')[-1].strip(\" ')\")}:{v}({v/ref:.3f})\" for k,v in r.items() if k.startswith('(')))"
done
cd $OUT && tar czf r4.tgz r && rm -rf r
ts done
