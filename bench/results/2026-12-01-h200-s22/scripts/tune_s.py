"""scripts/tune.py with CANDIDATES[256] replaced by (128,64,8,1), (128,64,8,2,2), (64,64,4,1)."""

import importlib.util
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("tune", here.parents[1] / "scripts" / "tune.py")
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
tune.CANDIDATES[256] = [(128, 64, 8, 1), (128, 64, 8, 2, 2), (64, 64, 4, 1)]
tune.main()
