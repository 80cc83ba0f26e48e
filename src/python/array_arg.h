// One argument: a borrowed, zero-copy view of the caller's array, and the checks every binding
// runs on it. A failed check raises TypeError (wrong kind or dtype) or ValueError (shape, strides,
// device, alignment) naming the argument and what it needs. Nothing is ever copied or converted: an
// array that does not fit is refused.
//
// Two ways in, one view. A plain torch tensor (torch.Tensor or nn.Parameter, CPU or CUDA, of a
// dtype dsa reads, not requiring grad, no negative bit) is read through its attributes --
// data_ptr(), dtype, shape, stride(), device -- which costs well under a microsecond; exporting it
// by DLPack costs several (torch's __dlpack__ is Python code that builds a capsule). Every other
// array, and any tensor outside that set, crosses by DLPack, so what torch refuses to export stays
// refused.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "python/dlpack.h"

namespace dsa::py {

enum class Dtype : uint8_t { kF32, kBf16, kU16, kU8, kI32, kI64, kOther };

std::string_view dtype_label(Dtype d);

// The Python type name of obj ("ndarray", "tuple", ...), for messages.
std::string type_name(pybind11::handle obj);

// Where an array lives: the device type (dlpack::kCpu or kCuda) and index.
struct Place {
  int32_t type = dlpack::kCpu;
  int32_t id = 0;
  bool cuda() const { return type == dlpack::kCuda; }
  bool operator==(const Place&) const = default;
  std::string label() const;  // "cpu" or "cuda:N"
};

class ArrayArg {
 public:
  // A plain torch tensor is read by its attributes; anything else by `obj.__dlpack__()`
  // (`stream=-1` for a CUDA array: the op runs on the caller's stream, which the caller orders).
  // TypeError when obj speaks no DLPack. `keep`: hold a reference to obj for the ArrayArg's life
  // (an argument of the current call needs none: the caller holds it).
  ArrayArg(pybind11::handle obj, const char* name, bool keep = false);
  ArrayArg(ArrayArg&& other) noexcept;
  ArrayArg(const ArrayArg&) = delete;
  ArrayArg& operator=(const ArrayArg&) = delete;
  ArrayArg& operator=(ArrayArg&&) = delete;
  ~ArrayArg();

  const char* name() const { return name_; }
  Place place() const { return place_; }
  Dtype dtype() const;
  int ndim() const { return ndim_; }
  int64_t dim(int i) const { return dims()[i]; }
  int64_t stride(int i) const { return dims()[ndim_ + i]; }  // in elements
  int64_t numel() const;
  void* data() const { return data_; }
  bool from_dlpack() const { return managed_ != nullptr; }  // false: read from torch attributes
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  std::string describe() const;  // "float32 [8, 128] on cuda:0"

  // ---- checks (raise on failure) ----
  void need_dtype(std::initializer_list<Dtype> allowed, const char* why = nullptr) const;
  void need_ndim(std::initializer_list<int> allowed) const;
  void need_dim(int i, int64_t size, const char* what) const;
  void need_contiguous() const;  // C-contiguous (size-1 dims may have any stride)
  // Rows of `width` elements: the last dim is unit-stride, every other dim is packed over the
  // ones after it, except the outermost, whose stride (the row stride, returned) may be larger.
  int64_t need_rows(int64_t width) const;
  void need_place(Place p, const ArrayArg& ref) const;  // same device as ref
  void need_aligned(int bytes) const;
  void need_place_kind() const;  // CPU or CUDA memory

 private:
  static constexpr int kInlineDims = 8;
  bool from_torch(pybind11::handle obj);  // false: not a tensor the attribute path reads
  void from_capsule(pybind11::handle obj);
  int64_t* resize_dims(int ndim);  // [ndim] shape then [ndim] strides
  const int64_t* dims() const {
    return heap_dims_.empty() ? inline_dims_.data() : heap_dims_.data();
  }
  [[noreturn]] void type_error(const std::string& need) const;
  [[noreturn]] void value_error(const std::string& need) const;

  const char* name_;
  void* data_ = nullptr;
  Place place_;
  dlpack::DataType dl_dtype_{};
  int ndim_ = 0;
  std::array<int64_t, 2 * kInlineDims> inline_dims_{};
  std::vector<int64_t> heap_dims_;            // only past kInlineDims dimensions
  dlpack::ManagedTensor* managed_ = nullptr;  // the consumed DLPack export, released on destruction
  pybind11::object kept_;                     // the array itself, when asked to keep it
};

// Whether plain torch tensors are read by their attributes (the default) or, switched off, cross by
// DLPack like every other array: for profiles that compare the two, and tests.
void set_torch_attributes(bool enabled);
bool torch_attributes();

// The CUDA stream an op on arrays at `place` runs on: `stream` when given; else, on CUDA, torch's
// current stream of that device when torch is imported (read through torch's C entry point, so
// `torch.cuda.stream(...)` and graph capture are followed on every call), else the legacy default
// stream 0. The CPU backend ignores it.
uintptr_t caller_stream(std::optional<uintptr_t> stream, Place place);

// Rows of `width` float32 values, at least `rows` of them, on ref's device; returns the row stride.
int64_t need_f32_rows(const ArrayArg& a, int64_t width, int64_t rows, const ArrayArg& ref);
// The same for an array whose dtype the caller has checked.
int64_t need_value_rows(const ArrayArg& a, int64_t width, int64_t rows, const ArrayArg& ref);

// A one-element int32 array on ref's device (n_real, an error counter).
void need_scalar_i32(const ArrayArg& a, const ArrayArg& ref);

// A contiguous 1-D array of `dtype` on ref's device, fewer than 2^31 rows; returns its length.
int need_vector(const ArrayArg& a, Dtype dtype, const ArrayArg& ref);

// The argument named `name` is required but was None.
[[noreturn]] void missing(const char* name, const char* what);

}  // namespace dsa::py
