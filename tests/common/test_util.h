// Shared test helpers: seeded random inputs (never zeros), poison patterns, error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dsa/dtype.h"

namespace dsa::testing {

// A seeded generator; every test draws fresh inputs from it.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return std::uniform_real_distribution<float>(lo, hi)(gen_);
  }
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  std::vector<float> normals(size_t n, float stddev = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(stddev);
    return v;
  }
  std::vector<Bf16> bf16s(size_t n, float stddev = 1.0f) {
    std::vector<Bf16> v(n);
    for (auto& x : v) x = float_to_bf16(normal(stddev));
    return v;
  }
  std::mt19937_64& gen() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// A float NaN pattern written over outputs before an op runs, so unwritten elements show.
inline constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
inline constexpr uint8_t kPoisonByte = 0xA5;

// ||a - b|| / ||b|| in float64. NaN anywhere gives +inf.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace dsa::testing
