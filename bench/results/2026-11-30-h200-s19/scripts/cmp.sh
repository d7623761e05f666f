#!/bin/bash
# usage: cmp.sh KS outprefix  -- compiles all 16 sm90 fwd (d, causal, dtype) with key_steps variant KS ("" = main)
source /work/venv/bin/activate
for dt in float16 bfloat16; do for d in 64 128 192 256; do for c in 0 1; do
  echo "KS=$1 python .scratch/s19/ptx.py $d $c $dt /tmp/$2-$dt-$d-$c"
done; done; done | xargs -P 2 -I{} bash -c "{} 2>&1 | grep -v Warn"
