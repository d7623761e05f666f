# Compile Hopper forward variants with the CUDA 13 DSL flavor (as on the GPU host) and show each step loop's
# segments between the wgmma waits (seg.py). usage: bash cc13.sh TAG spec...  (spec as in cc90.py: D:causal:dtype[:json])
# With nvidia-cutlass-dsl[cu13] installed (the test extra since this stop) no PYTHONPATH is needed; during the session
# the flavor sat in /tmp/cu13site (pip install --target, --no-deps) ahead of the CUDA 12 one.
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=/tmp/cu13site:/tmp/cu13site/nvidia_cutlass_dsl/dsl_packages FLASHCUTE_CACHE_DIR=/tmp/nocache-$RANDOM
tag=$1; shift
for spec in "$@"; do
  CC90=/tmp/cc13-$tag python "$here/cc90.py" "$spec" > /dev/null 2>&1
done
for d in /tmp/cc13-$tag/*/; do
  echo "## $d $(grep -c 'STL\|LDL' $d/k.sass) spill-lines"; python3 "$here/seg.py" $d/k.sass | tail -n +2
done
