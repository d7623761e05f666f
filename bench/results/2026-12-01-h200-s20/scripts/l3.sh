export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s20; L=/tmp/l3; mkdir -p $L
timeout 240 python3 -P -m flashcute.kernels.variants --arch sm_90a --only sm80-fwd --jobs 16 > $L/pc-new.log 2>&1; ts "pc new rc=$?"; tail -1 $L/pc-new.log
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_fwd.py -k sm80 > $L/test.log 2>&1; ts "tests rc=$?"; tail -2 $L/test.log
for dt in bfloat16 float16; do
timeout 150 python3 -P $S/tune_s.py --kernel sm80 --headdim 256 --seqlen 4096,16384 --rounds 4 --dtype $dt 2>/dev/null > $L/tune-$dt.log; ts "tune rc=$?"
python3 -c "
import sys,json
for l in open('$L/tune-$dt.log'):
    r=json.loads(l); print(r['dtype'][:4],r['headdim'],r['causal'],r['seqlen'],' '.join(f'{k}={v}' for k,v in r.items() if not k.startswith('error') and k not in('dtype','headdim','causal','seqlen')))"
done
timeout 100 python3 -P $S/tune_s.py --kernel sm80 --headdim 128 --seqlen 4096 --rounds 3 2>/dev/null > $L/tune-128.log; ts "tune rc=$?"; cut -c1-100 $L/tune-128.log; grep -o '"sdpa_flash.*' $L/tune-128.log
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
timeout 100 ncu --clock-control none -k 'regex:Sm80' --launch-skip 2 --launch-count 1 --metrics $M python3 -P $S/ncu80.py 256 0 4096 > $L/ncu.txt 2>&1; ts "ncu rc=$?"
grep -v "^==PROF==" $L/ncu.txt | grep -E "pct|duration|ratio|sum|second" | cut -c1-150
cd $L && tar czf $OUT/l3.tgz *.log *.txt 2>/dev/null
