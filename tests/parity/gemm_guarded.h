// What the GEMM parity tests share (test_parity_gemm.cpp, test_parity_gemm_fp8w.cpp): inputs
// hashed from (seed, index), so a row holds the same values whatever m, and device buffers with
// guard bytes on both sides; the fixtures' common base.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "dsa/backend.h"

namespace dsa::parity {

inline constexpr size_t kGuard = 256;

// 64 random bits from (seed, index) alone (splitmix64).
inline uint64_t hash_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A value in [-scale, scale) from (seed, index) alone, so row r holds the same bytes whatever m.
inline float hashed(uint64_t seed, uint64_t i, float scale = 1.0f) {
  return scale * (float(hash_bits(seed, i) >> 40) / float(1 << 24) * 2.0f - 1.0f);
}

inline uint8_t guard_byte(size_t i) { return uint8_t((i * 131u + 7u) | 1u); }

// A device buffer with guard bytes on both sides; read() reads it back whole.
class Guarded {
 public:
  Guarded(Backend& be, size_t bytes) : be_(be), bytes_(bytes), mem_(be, bytes + 2 * kGuard) {}
  void* data() const { return mem_.data() + kGuard; }
  void write(const void* host) {
    std::vector<uint8_t> all(bytes_ + 2 * kGuard);
    for (size_t i = 0; i < all.size(); ++i) all[i] = guard_byte(i);
    std::memcpy(all.data() + kGuard, host, bytes_);
    be_.copy_to_device(mem_.data(), all.data(), all.size());
    be_.synchronize();
  }
  // The contents; adds a failure when a guard byte changed.
  std::vector<uint8_t> read(const std::string& what) const {
    std::vector<uint8_t> all(bytes_ + 2 * kGuard);
    be_.copy_to_host(all.data(), mem_.data(), all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      if (i >= kGuard && i < kGuard + bytes_) continue;
      if (all[i] != guard_byte(i)) {
        ADD_FAILURE() << what << ": guard byte " << int64_t(i) - int64_t(kGuard) << " changed";
        break;
      }
    }
    return {all.begin() + kGuard, all.end() - kGuard};
  }

 private:
  Backend& be_;
  size_t bytes_;
  DeviceArray<uint8_t> mem_;
};

// The GEMM fixtures' base: a CPU and a CUDA backend (skips without a GPU), and the CUDA GEMM's
// tuning reset to its defaults after each test.
class GemmParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the parity tests need a GPU";
    cpu_ = make_cpu_backend();
    cuda_ = make_cuda_backend(0);
  }
  void TearDown() override {
    if (cuda_) set_gemm_invariant_tuning(*cuda_, {});
  }
  std::unique_ptr<Backend> cpu_, cuda_;
};

}  // namespace dsa::parity
