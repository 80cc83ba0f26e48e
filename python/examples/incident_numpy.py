"""The incident's toy decode loop on the CPU with numpy (see incident_scenario.py).

A "graph" here is what dsa.cpp's CPU runner does: the step is recorded once at the bucket size
over static buffers and replayed over the same buffers, so padding behaves as in a captured CUDA
graph. numpy has no bfloat16: the pool is uint16 holding bf16 bit patterns, and the unguarded line
rounds float32 to bf16 itself before its scatter.

    PYTHONPATH=build/python python3 python/examples/incident_numpy.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import incident_scenario as scenario  # noqa: E402


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (NaN is not produced here)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class NumpyArrays(scenario.Arrays):
    name = "numpy (cpu)"

    def pool(self, pages):
        return np.zeros((pages, scenario.PAGE, 128), dtype=np.uint16)

    def static_int64(self, n):
        return np.full(n, -1, dtype=np.int64)

    def static_f32(self, rows, cols):
        return np.zeros((rows, cols), dtype=np.float32)

    def int32_scalar(self):
        return np.zeros(1, dtype=np.int32)

    def set_rows(self, buf, values, rows):
        buf[:rows] = np.asarray(values, dtype=buf.dtype)

    def set_scalar(self, buf, value):
        buf[0] = value

    def unguarded_store(self, pool, loc, k):
        pool.reshape(-1, 128)[loc] = to_bf16_bits(k)  # the incident's line: every row, any slot

    def to_int(self, scalar):
        return int(scalar[0])

    def capture(self, step):
        return step  # replayed over the same static buffers at the same size


def main() -> None:
    rows = scenario.table(NumpyArrays())
    scenario.print_table(rows, "index-K bf16 store, numpy on the CPU (graph = fixed-size replay)")


if __name__ == "__main__":
    main()
