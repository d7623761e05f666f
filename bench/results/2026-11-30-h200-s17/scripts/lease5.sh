export PYTHONUNBUFFERED=1
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s17; FIN=$OUT; L=/tmp/l5; mkdir -p $L
cd $S && python3 mkvariants2.py $root $XS > /dev/null
SH="128:16384:0:bfloat16 128:4096:0:bfloat16 128:16384:0:float16 128:16384:1:bfloat16 64:16384:0:bfloat16 256:16384:0:float16"
for x in $XS; do TT_LOCK=/tmp/gpu.lock timeout 300 python3 -P $S/tiletl2.py $S/tt_$x $x $SH > $L/v-$x.log 2>&1 & done
wait; ts done
cat $L/v-*.log | grep RESULT > $L/results.txt
python3 - $L/results.txt <<'PY'
import sys, collections
r = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    _, tag, shape, _, cyc, _, mhz, _, spread = l.split()
    r[shape][tag] = (int(cyc), int(mhz), float(spread))
tags = sorted({t for s in r.values() for t in s})
print("shape".ljust(22) + "".join(t.rjust(8) for t in tags))
for shape, d in r.items():
    a = d.get("a", (None,))[0]
    print(shape.ljust(22) + "".join((f"{d[t][0]/a:8.4f}" if t in d and a else "       -") for t in tags) + f"   a={a}")
PY
grep -L RESULT $L/v-*.log | while read f; do echo "== $f"; grep -v Warn $f | tail -5; done
cd $L && tar czf $FIN/l5.tgz *.log *.txt
