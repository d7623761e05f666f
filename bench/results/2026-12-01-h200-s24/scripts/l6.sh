# lease 6 (s24): the Hopper forward against flash-attn-4 twice more (the #6 grid, five rounds each), main
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
mkdir -p $OUT/r
timeout 150 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 16 > $OUT/r/pc.log 2>&1; ts "pc rc=$?"
for i in 1 2; do
  timeout 200 python3 -m flashcute bench --seqlen 1k,4k,16k --backends flashcute-sm90,fa4 --rounds 5 --out $OUT/r/b$i > $OUT/r/bench$i.log 2>&1; ts "bench $i rc=$?"
done
cd $OUT && tar czf r6.tgz r && rm -rf r
ts done
