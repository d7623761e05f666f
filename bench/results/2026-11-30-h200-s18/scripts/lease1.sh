export PYTHONUNBUFFERED=1
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l1; mkdir -p $L
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_tile_cycles.py > $L/pytest.log 2>&1; ts "pytest rc=$?"; tail -2 $L/pytest.log
(timeout 400 python3 -P scripts/tile_cycles.py --headdim 128 --seqlen 16384 --causal no,yes --dtype bfloat16 --variant heuristic={} --variant before-s17='{"sum_chains": 4, "turn_before_k": false, "pass_turn_after_qk": false}' --out $L/main.json > $L/main.log 2>&1; ts "main rc=$?") &
V=(--variant base={} --variant s='{"pass_turn_after_qk": false, "pass_turn_after_s": true}' --variant kl='{"release_k_late": true}' --variant m2='{"max_chains": 2}' --variant m8='{"max_chains": 8}' --variant sc2='{"sum_chains": 2}' --variant skl='{"pass_turn_after_qk": false, "pass_turn_after_s": true, "release_k_late": true}' --variant m2sc2='{"max_chains": 2, "sum_chains": 2}')
(cd $S/o90 && PYTHONPATH=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages:$PWD timeout 500 python3 -P scripts/tile_cycles.py --headdim 128 --seqlen 16384 --causal no,yes --dtype bfloat16,float16 "${V[@]}" --out $L/o90a.json > $L/o90a.log 2>&1; ts "o90a rc=$?") &
(cd $S/o90 && PYTHONPATH=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages:$PWD timeout 500 python3 -P scripts/tile_cycles.py --headdim 64,256 --seqlen 16384 --causal no --dtype bfloat16,float16 "${V[@]}" --out $L/o90b.json > $L/o90b.log 2>&1; ts "o90b rc=$?") &
for d in 64 128 256; do
(cd $S/s80 && PYTHONPATH=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages:$PWD timeout 500 python3 -P scripts/tile_cycles.py --kernel sm80 --headdim $d --seqlen 4096,16384 --causal no,yes --dtype bfloat16,float16 --variant base={} --variant lv='{"late_v_wait": true}' --out $L/s80-$d.json > $L/s80-$d.log 2>&1; ts "s80 $d rc=$?") &
done
wait; ts done
for f in $L/main.log $L/o90a.log $L/o90b.log $L/s80-*.log; do echo "== $f"; grep -v "Warn\|exe_args" $f | tail -14; done
cd $L && tar czf $FIN/l1.tgz *.log *.json
