// Walsh-Hadamard rotation, in place: the executable spec.
//
// H_dim in Sylvester order (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]), applied with the fast
// transform: log2(dim) butterfly stages of span 1, 2, 4, ..., each (a, b) -> (a + b, a - b) in f32,
// then every element times scale. The indexer uses scale = dim^-1/2, which makes it orthonormal.
#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"

namespace dsa::cpu {
namespace {

constexpr int kMaxHadamardDim = 1024;

void check_params(const HadamardParams& p) {
  const bool power_of_two = p.dim > 0 && (p.dim & (p.dim - 1)) == 0;
  require(power_of_two && p.dim <= kMaxHadamardDim, ErrorCode::kInvalidArgument,
          "hadamard: dim {} must be a power of two <= {}", p.dim, kMaxHadamardDim);
  require(p.rows >= 0 && p.ld >= p.dim, ErrorCode::kInvalidArgument,
          "hadamard: rows {} must be >= 0 and row stride {} >= dim {}", p.rows, p.ld, p.dim);
  require(p.rows == 0 || p.x, ErrorCode::kInvalidArgument, "hadamard: x must be set");
}

}  // namespace

void hadamard(const HadamardParams& p) {
  check_params(p);
  for (int r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.ld;
    for (int span = 1; span < p.dim; span *= 2) {
      for (int block = 0; block < p.dim; block += 2 * span) {
        for (int i = block; i < block + span; ++i) {
          const float a = x[i], b = x[i + span];
          x[i] = a + b;
          x[i + span] = a - b;
        }
      }
    }
    for (int i = 0; i < p.dim; ++i) x[i] *= p.scale;
  }
}

}  // namespace dsa::cpu
