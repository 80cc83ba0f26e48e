// Top-k selection over the indexer's logits (DESIGN §1.6): the executable spec.
//
// Candidates are ranked by one strict total order, so the result is unique and deterministic:
//   1. a number ranks above NaN (NaN is the smallest of all, below -inf);
//   2. between numbers, the larger value ranks higher (-0 and +0 are equal);
//   3. otherwise (equal values, or both NaN) the lower position ranks higher.
// Only t < seq_len are candidates: the length masks, never a fill value. The chosen positions are
// written in ascending order, then -1 up to k.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"

namespace dsa::cpu {
namespace {

struct Candidate {
  float value;
  int32_t position;
};

// True when a ranks strictly above b in the total order above.
bool ranks_above(const Candidate& a, const Candidate& b) {
  const bool a_nan = std::isnan(a.value), b_nan = std::isnan(b.value);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.value != b.value) return a.value > b.value;
  return a.position < b.position;
}

// Writes the chosen positions of one row to out[0, k), ascending, -1 filled.
void select_row(const float* logits, int32_t seq_len, int k, std::vector<Candidate>& scratch,
                int32_t* out) {
  int taken = 0;
  if (seq_len <= k) {
    for (int32_t t = 0; t < seq_len; ++t) out[taken++] = t;  // every candidate is taken
  } else {
    scratch.resize(size_t(seq_len));
    for (int32_t t = 0; t < seq_len; ++t) scratch[size_t(t)] = {logits[t], t};
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), ranks_above);
    for (int i = 0; i < k; ++i) out[taken++] = scratch[size_t(i)].position;
    std::sort(out, out + taken);
  }
  std::fill(out + taken, out + k, -1);
}

void check_params(const TopkParams& p) {
  require(p.rows >= 0 && p.k > 0, ErrorCode::kInvalidArgument,
          "topk: rows {} must be >= 0 and k {} > 0", p.rows, p.k);
  require(p.out_slots == nullptr || p.page_table != nullptr, ErrorCode::kInvalidArgument,
          "topk: out_slots needs a page table");
}

}  // namespace

void topk(const TopkParams& p) {
  check_params(p);
  std::vector<Candidate> scratch;
  for (int r = 0; r < p.rows; ++r) {
    const int32_t seq_len = std::max(p.seq_lens[r], 0);  // a padded row selects nothing
    require(seq_len <= p.ld_logits, ErrorCode::kOutOfRange,
            "topk: row {} has seq_len {}, ld_logits is {}", r, seq_len, p.ld_logits);
    int32_t* positions = p.out_positions + int64_t(r) * p.k;
    select_row(p.logits + int64_t(r) * p.ld_logits, seq_len, p.k, scratch, positions);
    if (p.out_slots == nullptr) continue;
    require(int64_t(seq_len) <= p.ld_page_table * kPageSize, ErrorCode::kOutOfRange,
            "topk: row {} has seq_len {}, its page table holds {}", r, seq_len,
            p.ld_page_table * kPageSize);
    const int32_t* pages = p.page_table + int64_t(r) * p.ld_page_table;
    int64_t* slots = p.out_slots + int64_t(r) * p.k;
    for (int i = 0; i < p.k; ++i) {
      const int32_t t = positions[i];
      slots[i] = t < 0 ? kPadSlot : int64_t(pages[t / kPageSize]) * kPageSize + t % kPageSize;
    }
  }
}

}  // namespace dsa::cpu
