export PYTHONUNBUFFERED=1
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l6; mkdir -p $L
SH=""; for d in 64 128 256; do for c in 0 1; do for dt in bfloat16 float16; do SH="$SH $d:16384:$c:$dt"; done; done; done
for s in 1 4; do for k in 0 1; do for p in 0 1; do for e in 0 1; do
  tag=s$s-k$k-p$p-e$e; kb=$([ $k = 1 ] && echo true || echo false); pb=$([ $p = 1 ] && echo true || echo false); eb=$([ $e = 1 ] && echo true || echo false)
  TT_LOCK=/tmp/gpu.lock timeout 400 python3 -P $S/tiletl3.py $S/kn $tag "{\"sum_chains\": $s, \"turn_before_k\": $kb, \"pass_turn_after_qk\": $pb, \"rescale_o_early\": $eb}" $SH > $L/$tag.log 2>&1 &
done; done; done; done
wait; ts done
cat $L/*.log | grep RESULT > $L/results.txt; wc -l < $L/results.txt
python3 - $L/results.txt <<'PY'
import sys, collections
r = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    _, tag, shape, cyc, spread = l.split()
    r[shape][tag] = int(cyc)
tags = sorted({t for s in r.values() for t in s})
print("shape".ljust(20) + " ".join(t[:11].rjust(11) for t in tags))
for shape in sorted(r):
    d = r[shape]; dim = int(shape.split(":")[0]); base = f"s4-k0-p0-e{1 if dim > 128 else 0}"
    a = d.get(base)
    best = min(d, key=d.get)
    print(shape.ljust(20) + " ".join((f"{d[t]/a:11.4f}" if t in d and a else "          -") for t in tags) + f"  base={a} best={best} {d[best]/a:.4f}")
PY
grep -L RESULT $L/*.log | head -3 | while read f; do echo "== $f"; grep -v Warn $f | tail -4; done
cd $L && tar czf $FIN/l6.tgz *.log *.txt
