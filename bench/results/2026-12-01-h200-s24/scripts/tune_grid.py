"""scripts/tune.py, Hopper forward: the heuristic's persistent grid with claimed tiles against one thread block a
tile (grid_limit 2^30, as flash-attn-4 launches), at the heuristic's tile and step choices for D = 64, 128, 256."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("tune", Path.cwd() / "scripts" / "tune.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
tune.SM90_CANDIDATES[64] = [(192, 128, 2, False, True, "claim"), (192, 128, 2, False, True, "tile")]
tune.SM90_CANDIDATES[128] = [(128, 128, 2, False, True, "claim"), (128, 128, 2, False, True, "tile")]
tune.SM90_CANDIDATES[256] = [(128, 80, 2, True, False, "claim"), (128, 80, 2, True, False, "tile")]
tune.main()
