"""scripts/tune.py at D=128 (sm80), the heuristic's (128,64,4,2) tile with the row max in 1 or 2 chains a row, eager
and lazy rescaling: a candidate (128, 64, 4, 2, "lazy" | "eager", chains)."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("tune", Path.cwd() / "scripts" / "tune.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
tune.CANDIDATES[128] = [(128, 64, 4, 2, r, c) for r in ("eager", "lazy") for c in (1, 2)]
plain = tune.make_config


def make_config(kernel, d, dtype, causal, candidate):
    import dataclasses

    threshold = 8.0 if candidate[4] == "lazy" else None
    config = tune.fwd_config(d, dtype, causal=causal, tiles=candidate[:4], rescale_threshold=threshold)
    return dataclasses.replace(config, max_chains=candidate[5])


tune.make_config = make_config
tune.main()
