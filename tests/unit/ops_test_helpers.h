// Helpers shared by the reference-op tests: strided poisoned buffers, padding and bitwise checks,
// and the batch-invariance check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "common/test_util.h"
#include "dsa/dtype.h"

namespace dsa::ops_testing {

using testing::kPoison;
using testing::Rng;

inline constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff

inline double widen(Bf16 b) { return double(bf16_to_float(b)); }
inline bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }

// A [rows, ld] buffer: random normals in [0, dim) of every row, poison in the padding columns.
inline std::vector<float> strided_normals(Rng& rng, int rows, int dim, int64_t ld,
                                          float stddev = 1.0f, float mean = 0.0f) {
  std::vector<float> v(size_t(rows * ld), kPoison);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) v[size_t(r * ld + i)] = mean + rng.normal(stddev);
  }
  return v;
}

inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, kPoison); }

// Columns [dim, ld) of every row still hold the poison bits.
inline void expect_padding_untouched(const std::vector<float>& v, int rows, int dim, int64_t ld) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t i = dim; i < ld; ++i) {
      ASSERT_TRUE(same_bits(v[size_t(r * ld + i)], kPoison))
          << "padding written: row " << r << " col " << i;
    }
  }
}

// run(first, count) runs the op on rows [first, first + count) of fresh inputs into a fresh output
// buffer of [rows, ld], and returns that buffer. Row r of the full batch must equal, bit for bit,
// row r run alone.
inline void expect_batch_invariant(int rows, int64_t ld,
                                   const std::function<std::vector<float>(int, int)>& run) {
  const std::vector<float> batch = run(0, rows);
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> alone = run(r, 1);
    for (int64_t i = 0; i < ld; ++i) {
      const size_t at = size_t(r * ld + i);
      ASSERT_TRUE(same_bits(batch[at], alone[at])) << "row " << r << " col " << i;
    }
  }
}

}  // namespace dsa::ops_testing
