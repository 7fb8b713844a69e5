"""The Python module's ctypes layer against the library with the simulated
driver (no GPU, no torch), from the source tree:
python3 test_ctypes.py PATH_TO_LIBRARY. (Installed from the wheel:
python -m tensor_arena_cuda.selftest.)"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_arena_cuda import selftest  # noqa: E402

if __name__ == "__main__":
    selftest.main(sys.argv[1] if len(sys.argv) > 1 else None)
    print("python ctypes layer: ok")
