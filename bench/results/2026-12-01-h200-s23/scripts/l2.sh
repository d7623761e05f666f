# lease 2 (s23): mma.sync latency / mixed issue bf16 vs fp16; ncu source-level stall sampling, sm80 D=128 bf16 vs fp16,
# sm90 fp16 D=128 ours vs flash-attn-4
export PYTHONUNBUFFERED=1 FLASHCUTE_CACHE_DIR=/tmp/flashcute-cache
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=$PWD/.scratch/s23
mkdir -p $OUT/r
nvcc -arch=sm_90a -O3 -o /tmp/mma_lat $S/mma_lat.cu && timeout 60 /tmp/mma_lat > $OUT/r/mma_lat.txt 2>&1; ts "mma_lat rc=$?"
cat $OUT/r/mma_lat.txt
prof() {  # name kregex args...
  local name=$1 kre=$2; shift 2
  timeout 150 ncu --clock-control base -k "regex:$kre" --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --section InstructionStats -o /tmp/$name python3 -P $S/ncusrc.py "$@" > $OUT/r/$name.ncu.log 2>&1; ts "ncu $name rc=$?"
  ncu -i /tmp/$name.ncu-rep --page source --csv --print-source sass > $OUT/r/$name.src.csv 2> $OUT/r/$name.src.err; ts "src $name rc=$? $(wc -c < $OUT/r/$name.src.csv)"
  ncu -i /tmp/$name.ncu-rep --page details --csv > $OUT/r/$name.details.csv 2>&1
}
prof sm80-bf16 Sm80 sm80 128 0 4096 bfloat16
prof sm80-fp16 Sm80 sm80 128 0 4096 float16
prof sm90-fp16 flashcute sm90 128 0 4096 float16
prof fa4-fp16 flash_attn fa4 128 0 4096 float16
head -c 3000 $OUT/r/sm80-bf16.src.csv; cat $OUT/r/sm80-bf16.src.err | head
cd $OUT && tar czf r.tgz r && rm -rf r
ts done
