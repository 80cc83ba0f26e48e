// Rotary position embedding, in place: the executable spec.
//
// Pair i of a head (i in [0, rope_dim/2)) is rotated by the angle stored at
// cos_sin[position, i] = (c, s):  x' = x*c - y*s,  y' = x*s + y*c  (f32, each product rounded).
// Which two dims form pair i depends on the style (DESIGN §1.3):
//   kInterleaved: (offset + 2i, offset + 2i + 1)         MLA
//   kHalfSplit:   (offset + i,  offset + i + rope_dim/2)  the indexer
// A position outside [0, max_position) leaves its row untouched: a padded or bad row never reads
// past the table.
#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"

namespace dsa::cpu {
namespace {

void check_params(const RopeParams& p) {
  require(p.rows >= 0 && p.heads >= 0, ErrorCode::kInvalidArgument,
          "rope: rows {} and heads {} must be >= 0", p.rows, p.heads);
  require(p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.offset >= 0, ErrorCode::kInvalidArgument,
          "rope: rope_dim {} must be even and > 0, offset {} >= 0", p.rope_dim, p.offset);
  require(p.heads <= 1 || p.ld_head >= p.offset + p.rope_dim, ErrorCode::kInvalidArgument,
          "rope: head stride {} is shorter than offset {} + rope_dim {}", p.ld_head, p.offset,
          p.rope_dim);
  require(p.rows <= 1 || p.ld_row >= (p.heads - 1) * p.ld_head + p.offset + p.rope_dim,
          ErrorCode::kInvalidArgument, "rope: row stride {} is shorter than {} heads of stride {}",
          p.ld_row, p.heads, p.ld_head);
  require(!p.out || ((p.heads <= 1 || p.ld_out_head >= p.rope_dim) &&
                     (p.rows <= 1 || p.ld_out_row >= (p.heads - 1) * p.ld_out_head + p.rope_dim)),
          ErrorCode::kInvalidArgument,
          "rope: out strides (row {}, head {}) are shorter than {} heads of {} dims", p.ld_out_row,
          p.ld_out_head, p.heads, p.rope_dim);
  require(p.rows == 0 || p.heads == 0 || (p.x && p.positions && p.cos_sin),
          ErrorCode::kInvalidArgument, "rope: x, positions and cos_sin must be set");
}

}  // namespace

void rope(const RopeParams& p) {
  check_params(p);
  const int half = p.rope_dim / 2;
  // Distance between the two dims of a pair, and between consecutive pairs.
  const int pair_gap = p.style == RopeStyle::kInterleaved ? 1 : half;
  const int pair_step = p.style == RopeStyle::kInterleaved ? 2 : 1;
  for (int r = 0; r < p.rows; ++r) {
    const int32_t position = p.positions[r];
    if (position < 0 || position >= p.max_position) continue;
    const float* angles = p.cos_sin + int64_t(position) * p.rope_dim;  // [half, 2]
    for (int h = 0; h < p.heads; ++h) {
      float* head = p.x + r * p.ld_row + h * p.ld_head + p.offset;
      for (int i = 0; i < half; ++i) {
        const float c = angles[2 * i], s = angles[2 * i + 1];
        float* a = head + i * pair_step;
        float* b = a + pair_gap;
        const float x = *a, y = *b;
        *a = x * c - y * s;
        *b = x * s + y * c;
      }
    }
  }
  if (!p.out) return;
  // The copy_rows that follows the rotation: head h of row r is row r * heads + h of the copy.
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.heads; ++h) {
      const float* src = p.x + r * p.ld_row + h * p.ld_head + p.offset;
      float* dst = p.out + r * p.ld_out_row + h * p.ld_out_head;
      for (int j = 0; j < p.rope_dim; ++j) dst[j] = src[j];
    }
  }
}

}  // namespace dsa::cpu
