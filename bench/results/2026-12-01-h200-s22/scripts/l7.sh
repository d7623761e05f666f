# lease 7: ncu of branch sm80-stage-and's bf16 D=128 kernel (opaque thread index) beside main's
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
S=$PWD/.scratch/s22; SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__inst_executed_op_local_ld.sum,smsp__inst_executed_op_local_st.sum,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
cd $S/brtree && export PYTHONPATH=$SITE:$S/brtree
python3 -c "import flashcute; print(flashcute.__file__)"
python3 -P $S/ncu80.py 128 0 4096 bfloat16 > /dev/null 2>&1
timeout 100 ncu --clock-control base -k 'regex:Sm80' --launch-skip 2 --launch-count 1 --metrics $M python3 -P $S/ncu80.py 128 0 4096 bfloat16 > $OUT/ncu-branch-bf16.txt 2>&1; echo "rc=$?"
grep -v "^==PROF==" $OUT/ncu-branch-bf16.txt | grep -E "^  [a-z]" | sed 's/  */ /g'
