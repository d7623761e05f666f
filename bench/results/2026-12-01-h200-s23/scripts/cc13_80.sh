# compile sm80 fwd variants with the CUDA 13 DSL libraries (as on the GPU host): regs, spills, loop opcode mix
export PYTHONPATH=/tmp/cu13site:/tmp/cu13site/nvidia_cutlass_dsl/dsl_packages FLASHCUTE_CACHE_DIR=/tmp/nocache-$RANDOM
tag=$1; shift
for spec in "$@"; do
  python - "$spec" "$tag" <<'PY'
import sys, json, dataclasses, subprocess, re, collections
from pathlib import Path
from flashcute.config import fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import variant_label
spec, tag = sys.argv[1], sys.argv[2]
d, causal, dtype, *extra = spec.split(":", 3)
kw = json.loads(extra[0]) if extra else {}
if "tiles" in kw: kw["tiles"] = tuple(kw["tiles"])
repl = kw.pop("replace", {})
cfg = dataclasses.replace(fwd_config(int(d), dtype, causal == "1", arch="sm_90a", **kw), **repl)
dump = Path(f"/tmp/cc13_80-{tag}") / variant_label(cfg)
compile_fwd(cfg, "sm_90a", dump)
(cubin,) = dump.glob("*.cubin")
sass = subprocess.run(["/work/venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvdisasm", "-c", str(cubin)], capture_output=True, text=True).stdout
(dump / "k.sass").write_text(sass)
lines = sass.splitlines()
labels = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"^\.(L_x_\d+):", l.strip()))}
spans = []
for i, l in enumerate(lines):
    m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", l)
    if m and m.group(1) in labels and labels[m.group(1)] < i:
        spans.append((labels[m.group(1)], i))
def ops(a, b):
    c = collections.Counter()
    for l in lines[a:b]:
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", l)
        if m: c[m.group(1)] += 1
    return c
big = [s for s in spans if ops(*s)["HMMA"] >= 128]
tot = ops(0, len(lines))
print(f"{spec} {variant_label(cfg)}: kernel {sum(tot.values())} instr, STL {tot['STL']} LDL {tot['LDL']}")
for a, b in sorted(big):
    c = ops(a, b)
    print(f"   loop @{a} {sum(c.values())} instr: HMMA {c['HMMA']} LDSM {c['LDSM']} STL {c['STL']} LDL {c['LDL']} MOV {c['MOV']} IMAD {c['IMAD']} LOP3 {c['LOP3']} IADD3 {c['IADD3']} MUFU {c['MUFU']}")
PY
done
