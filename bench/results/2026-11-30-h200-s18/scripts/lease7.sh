export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l7; mkdir -p $L
SITE=/tmp/flashcute-site:/tmp/flashcute-site/nvidia_cutlass_dsl/dsl_packages
cd $S/mc; export PYTHONPATH=$SITE:$PWD
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum
timeout 100 ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "fa4/" --metrics $M python3 -P $S/ncu_cmp.py 128 0 16384 fp16 > $L/ncu-fp16.txt 2>&1; ts "ncu rc=$?"
grep -E "^  [a-zA-Z_]|lts__|hmma|duration|per_second|xbar" $L/ncu-fp16.txt | grep -v "at::" | cut -c1-120
PYTHONPATH=$SITE:$PWD python3 -P -m flashcute_base.kernels.variants --help > /dev/null 2>&1
(cd $S/mc && PYTHONPATH=$SITE:$S/abm timeout 200 python3 -P -m flashcute_base.kernels.variants --arch sm_90a --only sm90-fwd --exact-only --jobs 16 > $L/pc-base.log 2>&1; ts "pc base rc=$?")
timeout 330 python3 -P scripts/ab_inprocess.py run $S/abm $L/ab90.json --kernel sm90 --causal no > $L/ab90.log 2>&1; ts "ab90 rc=$?"
grep -v "Warn\|exe_args" $L/ab90.log | tail -20
cd $L && tar czf $FIN/l7.tgz *.log *.json *.txt
