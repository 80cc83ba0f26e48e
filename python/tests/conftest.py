import numpy as np
import pytest


def bf16_bits(x):
    """float32 -> bf16 bit patterns, round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def e4m3_table():
    """The float value of every e4m3fn byte (0x7F / 0xFF are NaN)."""
    out = np.zeros(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 7
        if exp == 0xF and man == 7:
            out[b] = np.nan
        elif exp == 0:
            out[b] = sign * man / 512.0
        else:
            out[b] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(7)
