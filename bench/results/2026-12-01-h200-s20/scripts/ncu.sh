set -u
export FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
ts() { echo "[$(date +%T)] $*"; }
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio
for p in "256 0 4096" "128 0 4096"; do
  ts start $p
  python3 -P .scratch/s20/ncu80.py $p > /dev/null 2>&1   # compile into the cache first
  timeout 200 ncu --clock-control none -k 'regex:Sm80|flash_fwd' --launch-skip 2 --launch-count 2 --metrics $M python3 -P .scratch/s20/ncu80.py $p > $OUT/ncu-$(echo $p | tr ' ' _).txt 2>&1
  ts done rc=$?
  grep -v "^==PROF==" $OUT/ncu-$(echo $p | tr ' ' _).txt | grep -E "Sm80|flash_fwd|pct|duration|ratio|sum|second" | cut -c1-150
done
