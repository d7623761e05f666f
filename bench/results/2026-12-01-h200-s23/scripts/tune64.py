"""scripts/tune.py with CANDIDATES[64] extended by (128,64,8,2,2) (warps in pairs that split rows) and (64,64,4,1)."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("tune", Path.cwd() / "scripts" / "tune.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
tune.CANDIDATES[64] = [*tune.CANDIDATES[64], (128, 64, 8, 2, 2), (64, 64, 4, 1)]
tune.main()
