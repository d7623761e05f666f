#!/usr/bin/env bash
# The GPU host's one command: pre-compile every kernel variant, run the GPU test suite, run the benchmark.
#
#   bash scripts/gpu_suite.sh OUT_DIR [pytest args ...] [-- bench args ...]
#
# Writes under OUT_DIR: gpu.txt, compile.log, pytest.log (+ junit.xml), bench.log and bench.tar.gz (results.json,
# results.md, plots), then prints a short summary last. SKIP_WARMUP=1 skips the pre-compile (the tests then build what
# they use, in their workers: a machine that limits one command's time can warm up in one and test in the next);
# SKIP_BENCH=1 skips the benchmark; SANITIZE=1 also runs
# `flashcute sanitize` (compute-sanitizer over every kind of kernel) into OUT_DIR/sanitize. The tests run in WORKERS
# processes (pytest-xdist; default: half the cores, at most 8; WORKERS=1: one), those of one xdist_group (the ones
# that need most of the GPU's memory) in the same one. FLASH_ATTN_TESTS=PATH (flash-attention's tests/test_flash_attn.py)
# also runs `flashcute flash-attn-tests` on it after the tests (a sample of FLASH_ATTN_SAMPLE cases, default 400) into
# OUT_DIR/flash-attn-tests.log. Run it from the repository root, with CuTe DSL importable.
set -uo pipefail
out=${1:?usage: gpu_suite.sh OUT_DIR [pytest args] [-- bench args]}
shift
pytest_args=()
bench_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do pytest_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift && bench_args=("$@")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export FLASHCUTE_CACHE_DIR=${FLASHCUTE_CACHE_DIR:-/tmp/flashcute-cache}
# A copied tree may have no .git, or a stale one: the caller names the commit (FLASHCUTE_GIT_COMMIT=$(git rev-parse
# --short HEAD) on its side), and that name wins.
commit=${FLASHCUTE_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
arch=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"sm_{m}{n}" + ("a" if m >= 9 else ""))')
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"

if [ "${SKIP_WARMUP:-0}" != 1 ]; then
  python3 -m flashcute warmup --all --arch "$arch" --jobs "$(nproc)" > "$out/compile.log" 2>&1
  tail -n 1 "$out/compile.log"
fi

workers=${WORKERS:-$(( $(nproc) / 2 < 8 ? $(nproc) / 2 : 8 ))}
parallel=()
if [ "$workers" -gt 1 ] && python3 -c 'import xdist' 2>/dev/null; then
  parallel=(-n "$workers" --dist loadgroup)
fi
# pytest.log names every test as it ends (-v) and the summary lists each failure (-rfE); the screen shows the
# failures as they come and pytest's section lines: a run cut short by a time limit still names what failed.
python3 -m pytest -m gpu -v -rfE -p no:cacheprovider "${parallel[@]}" --junitxml="$out/junit.xml" "${pytest_args[@]}" \
  2>&1 | tee "$out/pytest.log" | grep --line-buffered -E "FAILED|ERROR|^=|[0-9]+ (passed|failed)"
test_rc=${PIPESTATUS[0]}

sanitize_rc=0
if [ "${SANITIZE:-0}" = 1 ]; then
  python3 -m flashcute sanitize "$out/sanitize" > "$out/sanitize.log" 2>&1
  sanitize_rc=$?
fi

flash_attn_rc=0
if [ -n "${FLASH_ATTN_TESTS:-}" ]; then
  python3 -m flashcute flash-attn-tests --sample "${FLASH_ATTN_SAMPLE:-400}" --workers "$workers" "$FLASH_ATTN_TESTS" \
    > "$out/flash-attn-tests.log" 2>&1
  flash_attn_rc=$?
fi

bench_rc=0
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 -m flashcute bench --out "$out/bench" "${bench_args[@]}" > "$out/bench.log" 2>&1
  bench_rc=$?
  tar -czf "$out/bench.tar.gz" -C "$out" bench && rm -rf "$out/bench"
fi

echo
echo "== summary ($commit, $arch) =="
grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed|error" "$out/pytest.log" | tail -n 1
[ "${SANITIZE:-0}" = 1 ] && tail -n 5 "$out/sanitize.log"
[ -n "${FLASH_ATTN_TESTS:-}" ] && grep -E "^(=+ )?[0-9]+ (passed|failed)|^sample " "$out/flash-attn-tests.log"
[ "${SKIP_BENCH:-0}" != 1 ] && sed -n '/^|/p' "$out/bench.log" | head -n 40
echo "tests rc=$test_rc sanitize rc=$sanitize_rc flash-attn-tests rc=$flash_attn_rc bench rc=$bench_rc"
exit $(( test_rc != 0 || sanitize_rc != 0 || flash_attn_rc != 0 || bench_rc != 0 ))
