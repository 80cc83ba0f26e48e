// The CUDA kernels' environment knobs: variables the kernels' dispatch reads at every call (so a
// test or a bench may move one for a single call), each falling back to its default on a value it
// does not know. A typo there would change a row's kernel or split plan, and with them its bits,
// without a word; so every CUDA backend checks them when it is made (check_env_knobs) and refuses
// an unknown value, naming the variable and the values it takes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dsa::cuda {

struct EnvKnob {
  const char* name;                 // "DSA_CUDA_SPARSE_MLA_MAX_SPLITS"
  std::vector<std::string> values;  // the values it takes; unset or empty: the default
  const char* what;                 // one line: what it chooses and its default
};

// Every knob the attention kernels read (sparse MLA, the indexer, top-k), and the lanes'.
const std::vector<EnvKnob>& env_knobs();

// The GEMM's variables, which the backend parses itself (and refuses when unknown) when it is made.
const std::vector<std::string>& gemm_env_knob_names();

// Throws dsa::Error (kInvalidArgument) for the first knob set to a value outside its list:
// "DSA_CUDA_SPARSE_MLA_MAX_SPLITS '3' must be one of 2, 4, 8, 16 (unset: the default, ...)".
void check_env_knobs();

// DSA_CUDA_LANES (unset or on: true; off: false): whether a CUDA backend runs its side lane on a
// stream of its own. Read once, when the backend is made.
bool lanes_enabled();

// DSA_CUDA_INDEXER_Q=given: the fp8 indexer kernel reads the query's encoding indexer_query wrote.
bool indexer_reads_given_query();

// DSA_CUDA_INDEXER_TILES (unset or interleaved: true; contiguous: false): whether the wgmma
// indexer kernels' blocks take a row's tiles in turn (block x of G: tiles x, x + G, ...) or each a
// contiguous span. Read at every call.
bool indexer_interleaves_tiles();

// The knobs this process has set (non-empty), attention's then the GEMM's, in list order:
// "DSA_CUDA_PDL=on, DSA_CUDA_SPARSE_MLA_MAX_SPLITS=1"; empty when none is. A CUDA backend's
// describe() carries it, so every report that names the backend says which kernels it ran.
std::string env_knobs_set();

}  // namespace dsa::cuda
