"""scripts/tune.py with other sm80 candidates at D=256 and D=96 (the balanced round order re-timing of stop 23)."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("tune", Path.cwd() / "scripts" / "tune.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
tune.CANDIDATES[256] = [(128, 64, 8, 2, 2), (128, 64, 8, 1), (128, 128, 8, 1), (128, 32, 8, 2, 2), (128, 96, 8, 1, 2)]
tune.CANDIDATES[96] = [(128, 64, 4, 1), (128, 64, 4, 2), (128, 32, 4, 1), (128, 32, 4, 2), (128, 128, 4, 2)]
tune.main()
