// Tokenizer encode throughput on one core (Google Benchmark), over the mixed corpus that
// bench/text/hf_tokenizer_bench.py feeds Hugging Face tokenizers: the repository's C++ sources
// (sorted by path), README.md and tests/data/text/multilingual.txt, joined by newlines.
//
//   ./build/bench/dsa_bench_text [--tokenizer-dir DIR]   (default: DeepSeek-V3's, else tiny)
//   python3 bench/text/hf_tokenizer_bench.py [--tokenizer-dir DIR]
//
// EncodeMixed: MB/s over the whole corpus (the word cache warm after the first pass, as HF's is).
// EncodeTokens/N: a prompt of about N tokens (the corpus repeated), for the scaling curve;
// ns_per_token should stay flat from 10K to 200K tokens.
// EncodeOneWord/N: one N-byte piece ("a" repeated: a single pre-tokenized word), which goes
// through the heap merge; again ns/byte should stay flat.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "dsa/text/tokenizer.h"

namespace fs = std::filesystem;
using dsa::text::Tokenizer;

namespace {

fs::path g_tokenizer_dir;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string& corpus() {
  static const std::string text = [] {
    const fs::path root = DSA_SOURCE_DIR;
    std::vector<std::string> files;
    for (const char* dir : {"src", "tools", "include"}) {
      for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
        const auto ext = e.path().extension();
        if (e.is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh"))
          files.push_back(fs::relative(e.path(), root).generic_string());
      }
    }
    std::sort(files.begin(), files.end());
    files.push_back("README.md");
    files.push_back("tests/data/text/multilingual.txt");
    std::string all;
    for (const auto& f : files) all += read(root / f) + "\n";
    return all;
  }();
  return text;
}

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_dir(g_tokenizer_dir);
  return t;
}

// The prompt sizes of the scaling curve.
void scaling_sizes(benchmark::internal::Benchmark* b) {
  for (const int64_t n : {10'000, 50'000, 100'000, 200'000}) b->Arg(n);
  b->Unit(benchmark::kMillisecond);
}

// Nanoseconds per unit (token or byte), from `units` per iteration.
benchmark::Counter ns_per(size_t units) {
  return benchmark::Counter(double(units) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                      benchmark::Counter::kInvert);
}

// Encodes `text` once per iteration; returns its token count.
size_t encode_repeatedly(benchmark::State& state, const std::string& text) {
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tokenizer().encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * text.size()));
  return tokens;
}

void EncodeMixed(benchmark::State& state) {
  const std::string& text = corpus();
  const size_t tokens = encode_repeatedly(state, text);
  state.counters["corpus_bytes"] = double(text.size());
  state.counters["tokens"] = double(tokens);
}
BENCHMARK(EncodeMixed)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void EncodeTokens(benchmark::State& state) {
  const std::string& base = corpus();  // repeated to about N tokens, cut at a character boundary
  const double bytes_per_token = double(base.size()) / double(tokenizer().encode(base).size());
  const size_t want = size_t(double(state.range(0)) * bytes_per_token);
  std::string text;
  while (text.size() < want) text += base;
  text.resize(want);
  while (!text.empty() && (uint8_t(text.back()) & 0xC0) == 0x80) text.pop_back();  // whole chars
  if (!text.empty() && uint8_t(text.back()) >= 0xC0) text.pop_back();
  const size_t tokens = encode_repeatedly(state, text);
  state.counters["tokens"] = double(tokens);
  state.counters["ns_per_token"] = ns_per(tokens);
}
BENCHMARK(EncodeTokens)->Apply(scaling_sizes);

void EncodeOneWord(benchmark::State& state) {
  const std::string text(size_t(state.range(0)), 'a');
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer().encode(text).data());
  state.SetBytesProcessed(int64_t(state.iterations() * text.size()));
  state.counters["ns_per_byte"] = ns_per(text.size());
}
BENCHMARK(EncodeOneWord)->Apply(scaling_sizes);

void Decode(benchmark::State& state) {
  const auto ids = tokenizer().encode(corpus());
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer().decode(ids).data());
  state.SetBytesProcessed(int64_t(state.iterations() * corpus().size()));
}
BENCHMARK(Decode)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  g_tokenizer_dir = DSA_DEEPSEEK_TOKENIZER_DIR;
  if (!fs::exists(g_tokenizer_dir / "tokenizer.json"))
    g_tokenizer_dir = fs::path(DSA_SOURCE_DIR) / "data/tokenizers/tiny";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--tokenizer-dir" && i + 1 < argc) {
      g_tokenizer_dir = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  std::cerr << "tokenizer: " << g_tokenizer_dir << ", corpus: " << corpus().size() << " bytes\n";
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
