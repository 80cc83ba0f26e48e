// RoPE angles on the host, so both backends rotate by identical cos/sin values.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "dsa/model.h"

namespace dsa {
namespace {

// DeepSeek's yarn: pairs past the correction range (low frequencies, long wavelengths) are divided
// by `factor`, pairs before it (high frequencies) are kept, with a linear ramp between.
std::vector<double> inv_freq(const ModelConfig& c) {
  const int dim = c.qk_rope_head_dim, half = dim / 2;
  const double base = c.rope_theta;
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) f[i] = 1.0 / std::pow(base, double(2 * i) / dim);
  if (c.rope_scaling.type != "yarn") return f;
  const auto& s = c.rope_scaling;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double smooth = 1.0 - ramp;
    f[i] = f[i] / s.factor * (1.0 - smooth) + f[i] * smooth;
  }
  return f;
}

}  // namespace

std::vector<float> rope_cos_sin_table(const ModelConfig& config, int max_position) {
  const std::vector<double> f = inv_freq(config);
  const size_t half = f.size();
  std::vector<float> table(size_t(max_position) * half * 2);
  for (int p = 0; p < max_position; ++p) {
    for (size_t i = 0; i < half; ++i) {
      const double angle = double(p) * f[i];
      table[(size_t(p) * half + i) * 2 + 0] = float(std::cos(angle));
      table[(size_t(p) * half + i) * 2 + 1] = float(std::sin(angle));
    }
  }
  return table;
}

}  // namespace dsa
