export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
root=$PWD; S=$root/.scratch/s18; FIN=$OUT; L=/tmp/l5; mkdir -p $L
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors.sum,lts__t_sectors_op_read.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_op_shared_ld.sum,lts__t_sectors_srcunit_tex_op_write.sum
for dt in fp16 bf16; do
timeout 200 ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "fa4/" --metrics $M python3 -P $S/ncu_cmp.py 128 0 16384 $dt > $L/ncu-$dt.txt 2>&1; ts "ncu $dt rc=$?"
grep -E "^  [a-zA-Z_]|lts__|dram__|smsp__inst|hmma|duration|per_second|l1tex" $L/ncu-$dt.txt | cut -c1-140
done
cd $L && tar czf $FIN/l5.tgz *.txt
