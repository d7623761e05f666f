"""The CuTe DSL element types of the config dtypes."""

import cutlass

CUTLASS_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
