import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from configs import all_configs

from flashcute.kernels.variants import _compile_one

cs = all_configs()
with ProcessPoolExecutor(int(sys.argv[1])) as pool:
    secs = list(pool.map(_compile_one, cs, ["sm_90a"] * len(cs)))
print(len(cs), "configs", [round(s, 1) for s in secs])
