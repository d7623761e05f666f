"""loop stats of fwd variants compiled with extra ptxas options. env PTXAS='...'; args: kind:d:causal:dtype ..."""

import os
import shutil
import subprocess
import sys

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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopmix import loops  # noqa: E402

for spec in sys.argv[1:]:
    kind, d, c, dt = spec.split(":")
    cfg = (sm90_fwd_config if kind == "90" else fwd_config)(int(d), dt, causal=c == "1")
    dump = Path(f"/tmp/regu-{os.getpid()}-{spec.replace(':', '_')}")
    shutil.rmtree(dump, ignore_errors=True)
    B.compile_fwd(cfg, "sm_90a", dump)
    cub = next(dump.glob("*.cubin"))
    r = inspect_cubin(cub)
    sass = dump / "k.sass"
    sass.write_text(subprocess.run([str(tool("nvdisasm")), "-c", str(cub)], capture_output=True, text=True).stdout)
    ls = loops(str(sass), "MMA", 1500)
    print(
        f"{extra or 'default':22s} {spec:16s} regs {r.registers} spills {r.spills} total {r.instructions}",
        f"loops {[len(b) for b in ls]} ldl {[sum(('LDL' in x or 'STL' in x) for x in b) for b in ls]}",
        flush=True,
    )
