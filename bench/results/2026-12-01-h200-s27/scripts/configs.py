"""The probe's kernel configs: the in-place (exp_in_place) Hopper forward where the GPU tests reach it, and the
heuristic's D=256 kernels for the A/B."""

from flashcute.config import sm90_fwd_config

DT = ("bfloat16", "float16")


def inplace(d, dt, causal):
    return sm90_fwd_config(d, dt, causal=causal, exp_in_place=True)


def base(d, dt, causal):
    return sm90_fwd_config(d, dt, causal=causal, exp_in_place=False)


def all_configs():
    out = []
    for dt in DT:
        for d in (64, 256):
            for c in (False, True):
                out.append(inplace(d, dt, c))
        for d in (128, 192):
            out.append(inplace(d, dt, True))
        for c in (False, True):
            out.append(base(256, dt, c))
    return list(dict.fromkeys(out))
