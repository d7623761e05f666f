"""loop stats of fwd variants compiled with extra ptxas options. env PTXAS='...'; args: kind:d:causal:dtype ..."""
import os, sys, re, shutil, subprocess
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from pathlib import Path
import flashcute.kernels.build as B
from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.kernels.sass import inspect_cubin, tool
extra = os.environ.get("PTXAS", "")
def _compile(kernel, config, arch, dump_dir, *tensors, scalars=B.ATTENTION_SCALARS):
    import cutlass.cute as cute
    options = f"--enable-tvm-ffi --gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    if extra:
        options += f" --ptxas-options '{extra}'"
    dump_dir.mkdir(parents=True, exist_ok=True)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(kernel, *tensors, *scalars, stream, options=options)
B._compile = _compile
sys.argv[0] = "x"
exec(open("/work/main/.scratch/s19/loopmix.py").read().split("res = ")[0].replace('any("HGMMA" in x for x in body)', 'any("MMA" in x for x in body)').replace("len(body) < 700", "len(body) < 1500"))
for spec in sys.argv[1:]:
    kind, d, c, dt = spec.split(":")
    cfg = (sm90_fwd_config if kind == "90" else fwd_config)(int(d), dt, causal=c == "1")
    dump = Path(f"/tmp/regu-{os.getpid()}-{spec.replace(':','_')}"); shutil.rmtree(dump, ignore_errors=True)
    B.compile_fwd(cfg, "sm_90a", dump)
    cub = next(dump.glob("*.cubin")); r = inspect_cubin(cub)
    sass = dump / "k.sass"; sass.write_text(subprocess.run([str(tool("nvdisasm")), "-c", str(cub)], capture_output=True, text=True).stdout)
    ls = loops(str(sass))
    print(f"{extra or 'default':22s} {spec:16s} regs {r.registers} spills {r.spills} total {r.instructions} loops {[len(b) for b in ls]} ldl {[sum(('LDL' in x or 'STL' in x) for x in b) for b in ls]}", flush=True)
