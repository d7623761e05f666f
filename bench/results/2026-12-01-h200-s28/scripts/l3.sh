# lease 3 (call B, after install.sh b, env.sh): the weakest #6 point of lease 2 (bf16 D=256 causal 16k): ncu of ours
# and flash-attn-4, power loops; sm80 fp16 D=128 causal re-timed against SDPA flash. $S/ncusrc.py was
# bench/results/2026-12-01-h200-s23/scripts/ncusrc.py.
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=/tmp/scratch/s28
mkdir -p $OUT/r
prof() {  # name kregex args...
  local name=$1 kre=$2; shift 2
  timeout 120 ncu --clock-control none -k "regex:$kre" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis -o /tmp/$name python3 -P $S/ncusrc.py "$@" > $OUT/r/$name.ncu.log 2>&1; ts "ncu $name rc=$?"
  ncu -i /tmp/$name.ncu-rep --page details --csv > $OUT/r/$name.details.csv 2>&1
}
prof sm90-bf16-d256c flashcute sm90 256 1 16384 bfloat16
prof fa4-bf16-d256c flash_attn fa4 256 1 16384 bfloat16
timeout 80 python3 -P scripts/power_loop.py --backends flashcute-sm90,fa4 --headdim 256 --seqlen 16384 --causal yes --dtype bf16,fp16 --seconds 3 --repeats 2 --out $OUT/r/power.json > $OUT/r/power.log 2>&1; ts "power rc=$?"
FLASHCUTE_GIT_COMMIT=$(cat $S/commit) timeout 120 python3 -m flashcute.bench --out $OUT/r/bench80 --dtype fp16,bf16 --headdim 128 --causal yes --seqlen 4k,16k --backends flashcute-sm80,sdpa-flash --rounds 5 > $OUT/r/bench80.log 2>&1; ts "bench80 rc=$?"
for n in sm90-bf16-d256c fa4-bf16-d256c; do echo "== $n"; grep -E '"(Duration|SM Frequency|Executed Instructions|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L2 Hit Rate|No Eligible|Warp Cycles Per Issued Instruction|Executed Ipc Active)"' $OUT/r/$n.details.csv | awk -F'","' '{print $(NF-2)" ["$(NF-1)"] "$NF}' | head -20; done
grep "J/PFLOP" $OUT/r/power.log
sed -n '/^|/p' $OUT/r/bench80.log
cd $OUT && tar czf r3.tgz r && rm -rf r
ts done
