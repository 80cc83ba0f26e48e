// The op-case table of the parity tests: every CUDA op against the CPU reference.
//
// A case (OpCase) declares its buffers in a Workspace, fills its inputs from a seeded Rng (never
// zeros), and launches the op on one side. The harness then, for each side:
//   - writes the same input bytes, writes every output's poison (or initial contents), and
//     surrounds every buffer with guard bytes;
//   - runs the op, synchronizes, reads every output back with its guards;
// and checks: the guards are untouched on both sides, each output matches by its Check (exact
// bytes for stores, masks and indices; nmse for floats), and a second CUDA run gives the same
// bits. check_batch_invariance runs one case family at several row counts on CUDA and requires
// the shared rows to come back bit-identical.
//
// Case convention (batch invariance relies on it): init draws the batch-independent data first
// (weights, tables, caches), then the per-row data in row order, so the first B rows of a case
// with more rows are the same bytes as a case with B rows.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "dsa/backend.h"

namespace dsa::parity {

enum class Side { kCpu, kCuda };
inline const char* side_name(Side s) { return s == Side::kCpu ? "cpu" : "cuda"; }

// How one output is compared between the CPU reference and CUDA.
//
// Floats are compared twice: by nmse over the whole buffer, which a single wrong element of a
// large output hardly moves, and per row by max |cpu - cuda| <= row_bound * max |cpu| over that
// row's finite elements, which it does. row_bound defaults to 16 sqrt(tolerance): an error spread
// evenly at the nmse bound stays far below it, one wrong element of a row does not.
struct Check {
  enum class Kind { kExact, kNmseF32 };
  Kind kind = Kind::kExact;
  double tolerance = 0.0;  // kNmseF32: bound on sum (a-b)^2 / sum b^2
  int64_t row_elems = 0;   // kNmseF32: floats per row for the max-abs bound; 0: one row
  double row_bound = 0.0;  // kNmseF32: per-row max |a-b| relative to the row's max |b|

  static Check exact() { return {Kind::kExact, 0.0}; }
  // Floats: elements with identical bits (poison included) match; NaN on one side only fails.
  static Check nmse(double tolerance) {
    return {Kind::kNmseF32, tolerance, 0, 16.0 * std::sqrt(tolerance)};
  }
  Check per_row(int64_t elems) const {
    Check c = *this;
    c.row_elems = elems;
    return c;
  }
};

// kRowMajor: the buffer is [rows, ...] contiguous, so the first B rows of a bigger case are
// comparable (batch invariance). kWhole: not split by rows (a pool, a table).
enum class RowLayout { kRowMajor, kWhole };

// A typed handle to a workspace buffer.
template <typename T>
struct Buf {
  int id = -1;
};

inline constexpr size_t kGuardBytes = 256;  // before and after every buffer; keeps 256 alignment

// Buffers mirrored on the CPU and the CUDA backend, with guards, poison and read-back.
class Workspace {
 public:
  Workspace(Backend& cpu, Backend& cuda) : cpu_(cpu), cuda_(cuda) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (auto& b : buffers_) {
      if (b.base[0]) cpu_.deallocate(b.base[0]);
      if (b.base[1]) cuda_.deallocate(b.base[1]);
    }
  }

  // Read-only data, the same bytes on both sides.
  template <typename T>
  Buf<T> input(const std::vector<T>& host) {
    return add<T>(Role::kInput, as_bytes(host), poison_of<T>(), Check::exact(), RowLayout::kWhole);
  }
  // Written by the op; poisoned before every run (NaN for floats, 0xA5 bytes otherwise).
  template <typename T>
  Buf<T> output(size_t count, Check check, RowLayout rows = RowLayout::kRowMajor) {
    std::vector<uint8_t> init(count * sizeof(T));
    const std::vector<uint8_t> p = poison_of<T>();
    for (size_t i = 0; i < init.size(); ++i) init[i] = p[i % p.size()];
    return add<T>(Role::kOutput, std::move(init), p, check, rows);
  }
  // Read and written (a pool, an in-place activation): reset to `initial` before every run.
  template <typename T>
  Buf<T> inout(const std::vector<T>& initial, Check check, RowLayout rows = RowLayout::kWhole) {
    return add<T>(Role::kOutput, as_bytes(initial), poison_of<T>(), check, rows);
  }

  template <typename T>
  T* ptr(Buf<T> b, Side side) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(buffers_.at(b.id).base[idx(side)]) +
                                kGuardBytes);
  }
  Backend& backend(Side side) const { return side == Side::kCpu ? cpu_ : cuda_; }

  // ---- used by the harness ----
  struct Readback {
    std::vector<std::vector<uint8_t>> outputs;  // per output buffer, without guards
    std::string guard_report;                   // empty when every guard is intact
  };
  // Writes guards, inputs and initial output bytes on one side (synchronized).
  void prepare(Side side) {
    Backend& be = backend(side);
    for (auto& b : buffers_) {
      std::vector<uint8_t> all = guard_pattern(b.id, b.init.size());
      std::memcpy(all.data() + kGuardBytes, b.init.data(), b.init.size());
      be.copy_to_device(b.base[idx(side)], all.data(), all.size());
    }
    be.synchronize();
  }
  // Reads every output back and checks every guard (inputs' guards and bytes too).
  Readback read(Side side) {
    Backend& be = backend(side);
    be.synchronize();
    Readback rb;
    std::ostringstream guards;
    for (auto& b : buffers_) {
      std::vector<uint8_t> all(b.init.size() + 2 * kGuardBytes);
      be.copy_to_host(all.data(), b.base[idx(side)], all.size());
      const std::vector<uint8_t> want = guard_pattern(b.id, b.init.size());
      for (size_t i = 0; i < all.size(); ++i) {
        const bool in_data = i >= kGuardBytes && i < kGuardBytes + b.init.size();
        if (in_data && b.role == Role::kOutput) continue;
        const uint8_t expect = in_data ? b.init[i - kGuardBytes] : want[i];
        if (all[i] != expect) {
          guards << side_name(side) << ": buffer " << b.id
                 << (in_data ? " (an input) changed at byte " : " guard changed at byte ")
                 << (int64_t(i) - int64_t(kGuardBytes)) << " (relative to its start)\n";
          break;
        }
      }
      if (b.role == Role::kOutput) {
        rb.outputs.emplace_back(all.begin() + kGuardBytes, all.end() - kGuardBytes);
      }
    }
    rb.guard_report = guards.str();
    return rb;
  }
  struct OutputInfo {
    int id;
    Check check;
    RowLayout rows;
    size_t elem_size;
  };
  std::vector<OutputInfo> outputs() const {
    std::vector<OutputInfo> v;
    for (auto& b : buffers_) {
      if (b.role == Role::kOutput) v.push_back({b.id, b.check, b.rows, b.elem_size});
    }
    return v;
  }

 private:
  enum class Role { kInput, kOutput };
  struct Entry {
    int id;
    Role role;
    size_t elem_size;
    std::vector<uint8_t> init;  // inputs, initial contents or poison
    Check check;
    RowLayout rows;
    void* base[2] = {nullptr, nullptr};  // cpu, cuda: kGuardBytes + data + kGuardBytes
  };

  static int idx(Side s) { return s == Side::kCpu ? 0 : 1; }
  template <typename T>
  static std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> out(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  template <typename T>
  static std::vector<uint8_t> poison_of() {
    std::vector<uint8_t> p(sizeof(T), testing::kPoisonByte);
    if constexpr (std::is_same_v<T, float>) std::memcpy(p.data(), &testing::kPoison, 4);
    return p;
  }
  // A per-buffer pattern, so a write that lands in another buffer's guard is visible too.
  static std::vector<uint8_t> guard_pattern(int id, size_t data_bytes) {
    std::vector<uint8_t> g(data_bytes + 2 * kGuardBytes, 0);
    uint32_t h = 0x9E3779B9u * uint32_t(id + 1);
    for (size_t i = 0; i < g.size(); ++i) {
      h = h * 1664525u + 1013904223u;
      g[i] = uint8_t(h >> 24) | 1u;  // never zero
    }
    return g;
  }
  template <typename T>
  Buf<T> add(Role role, std::vector<uint8_t> init, std::vector<uint8_t> poison, Check check,
             RowLayout rows) {
    (void)poison;
    Entry e{int(buffers_.size()), role, sizeof(T), std::move(init), check, rows};
    const size_t total = e.init.size() + 2 * kGuardBytes;
    e.base[0] = cpu_.allocate(total);
    e.base[1] = cuda_.allocate(total);
    buffers_.push_back(std::move(e));
    return Buf<T>{buffers_.back().id};
  }

  Backend& cpu_;
  Backend& cuda_;
  std::vector<Entry> buffers_;
};

// The RoPE angle table the cases share: [max_position, rope_dim / 2, 2] (cos, sin) of
// position * 10000^(-2i / rope_dim).
inline std::vector<float> rope_test_table(int max_position, int rope_dim) {
  std::vector<float> table(size_t(max_position) * rope_dim);
  for (int pos = 0; pos < max_position; ++pos) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / rope_dim);
      table[size_t(pos) * rope_dim + 2 * i] = float(std::cos(angle));
      table[size_t(pos) * rope_dim + 2 * i + 1] = float(std::sin(angle));
    }
  }
  return table;
}

// One parameterised op run. See the case convention at the top of this file.
class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string name() const = 0;  // "rmsnorm"
  virtual std::string vars() const = 0;  // "rows=7,dim=512"
  virtual void init(Workspace& ws, testing::Rng& rng) = 0;
  // Launches the op on one side, using only ws.ptr(..., side) pointers and ws.backend(side).
  virtual void run(Workspace& ws, Side side) = 0;
};

// ---- comparison ----

// Empty when equal; otherwise a one-line description of the first difference.
inline std::string compare_output(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                                  const Check& check) {
  std::ostringstream os;
  if (cpu.size() != gpu.size()) return "size differs";
  if (check.kind == Check::Kind::kExact) {
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i] != gpu[i] && diffs++ == 0) first = i;
    }
    if (diffs == 0) return {};
    os << diffs << " bytes differ, first at byte " << first << " (cpu 0x" << std::hex
       << int(cpu[first]) << ", cuda 0x" << int(gpu[first]) << ")";
    return os.str();
  }
  const size_t n = cpu.size() / 4;
  double num = 0, den = 0, max_abs = 0;
  size_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    float a, b;
    std::memcpy(&a, &cpu[i * 4], 4);
    std::memcpy(&b, &gpu[i * 4], 4);
    if (std::memcmp(&a, &b, 4) == 0) continue;
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      os << "element " << i << ": cpu " << a << ", cuda " << b << " (non-finite on one side)";
      return os.str();
    }
    const double d = double(a) - double(b);
    num += d * d;
    if (std::fabs(d) > max_abs) max_abs = std::fabs(d), worst = i;
  }
  for (size_t i = 0; i < n; ++i) {
    float a;
    std::memcpy(&a, &cpu[i * 4], 4);
    if (std::isfinite(a)) den += double(a) * double(a);
  }
  const double nmse = den > 0 ? num / den : num;
  if (nmse > check.tolerance) {
    os << "nmse " << nmse << " > " << check.tolerance << " (max |diff| " << max_abs
       << " at element " << worst << ")";
    return os.str();
  }
  const size_t row = check.row_elems > 0 ? size_t(check.row_elems) : std::max<size_t>(n, 1);
  for (size_t r0 = 0; r0 < n; r0 += row) {
    double row_max = 0, row_diff = 0;
    size_t at = r0;
    for (size_t i = r0; i < std::min(n, r0 + row); ++i) {
      float a, b;
      std::memcpy(&a, &cpu[i * 4], 4);
      std::memcpy(&b, &gpu[i * 4], 4);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;  // poison on both sides, checked above
      row_max = std::max(row_max, std::fabs(double(a)));
      const double d = std::fabs(double(a) - double(b));
      if (d > row_diff) row_diff = d, at = i;
    }
    if (row_diff > check.row_bound * row_max) {
      os << "row " << r0 / row << ": max |diff| " << row_diff << " at element " << at << " > "
         << check.row_bound << " * the row's max |cpu| " << row_max << " (nmse " << nmse
         << " passed)";
      return os.str();
    }
  }
  return {};
}

// Runs the case on one side: prepare, run, read back.
inline Workspace::Readback run_side(OpCase& c, Workspace& ws, Side side) {
  ws.prepare(side);
  c.run(ws, side);
  return ws.read(side);
}

// The parity check of one case: CPU vs CUDA, guards on both, and a bitwise CUDA rerun.
inline ::testing::AssertionResult check_parity(OpCase& c, Backend& cpu, Backend& cuda,
                                               uint64_t seed = 1234) {
  Workspace ws(cpu, cuda);
  testing::Rng rng(seed);
  c.init(ws, rng);
  const auto ref = run_side(c, ws, Side::kCpu);
  const auto got = run_side(c, ws, Side::kCuda);
  const auto again = run_side(c, ws, Side::kCuda);
  std::ostringstream fail;
  fail << ref.guard_report << got.guard_report;
  const auto outs = ws.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string d = compare_output(ref.outputs[i], got.outputs[i], outs[i].check);
    if (!d.empty()) fail << "output " << i << ": " << d << "\n";
    if (got.outputs[i] != again.outputs[i]) fail << "output " << i << ": CUDA rerun differs\n";
  }
  const std::string msg = fail.str();
  if (msg.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.name() << " [" << c.vars() << "]\n" << msg;
}

// Batch invariance on CUDA: make(rows) builds the same case family at each row count; every
// kRowMajor output's first rows must be bit-identical to those of the largest run.
inline ::testing::AssertionResult check_batch_invariance(
    const std::function<std::unique_ptr<OpCase>(int rows)>& make, const std::vector<int>& sizes,
    Backend& cpu, Backend& cuda, uint64_t seed = 99) {
  std::vector<std::vector<std::vector<uint8_t>>> runs;
  std::vector<std::vector<Workspace::OutputInfo>> infos;
  std::string name;
  for (int rows : sizes) {
    auto c = make(rows);
    name = c->name() + " [" + c->vars() + "]";
    Workspace ws(cpu, cuda);
    testing::Rng rng(seed);
    c->init(ws, rng);
    auto rb = run_side(*c, ws, Side::kCuda);
    if (!rb.guard_report.empty()) {
      return ::testing::AssertionFailure() << name << "\n" << rb.guard_report;
    }
    runs.push_back(std::move(rb.outputs));
    infos.push_back(ws.outputs());
  }
  size_t largest = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (sizes[s] > sizes[largest]) largest = s;
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    for (size_t i = 0; i < runs[s].size(); ++i) {
      if (infos[s][i].rows != RowLayout::kRowMajor) continue;
      const auto& small = runs[s][i];
      const auto& big = runs[largest][i];
      if (small.size() > big.size() || std::memcmp(small.data(), big.data(), small.size()) != 0) {
        return ::testing::AssertionFailure()
               << name << ": output " << i << " at rows=" << sizes[s]
               << " differs from the same rows at rows=" << sizes[largest];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The fixture of every parity suite: skips without a device, else holds both backends.
// Suites derive a named fixture: class ParityStore : public dsa::parity::ParityTest {};
class ParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the parity tests need a GPU";
    cpu_ = make_cpu_backend();
    cuda_ = make_cuda_backend(0);
  }
  Backend& cpu() { return *cpu_; }
  Backend& cuda() { return *cuda_; }

  std::unique_ptr<Backend> cpu_, cuda_;
};

}  // namespace dsa::parity
