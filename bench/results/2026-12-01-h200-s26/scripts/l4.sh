# lease 4 (s26): ncu on the weakest #6 point, fp16 D=256 causal 16k: ours (7f1abef) against flash-attn-4
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s26
mkdir -p $OUT/r
prof() {  # name kregex args...
  local name=$1 kre=$2; shift 2
  timeout 120 ncu --clock-control none -k "regex:$kre" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats -o /tmp/$name python3 -P $S/ncusrc.py "$@" > $OUT/r/$name.ncu.log 2>&1; ts "ncu $name rc=$?"
  ncu -i /tmp/$name.ncu-rep --page details --csv > $OUT/r/$name.details.csv 2>&1
}
prof sm90-fp16-d256c flashcute sm90 256 1 16384 float16
prof fa4-fp16-d256c flash_attn fa4 256 1 16384 float16
for n in sm90-fp16-d256c fa4-fp16-d256c; do echo "== $n"; grep -E '"(Duration|SM Frequency|Executed Instructions|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|No Eligible|Warp Cycles Per Issued Instruction|Executed Ipc Active)"' $OUT/r/$n.details.csv | awk -F'","' '{print $(NF-2)" ["$(NF-1)"] "$NF}' | head -20; done
cd $OUT && tar czf r4.tgz r && rm -rf r
ts done
