// One argument handed over by DLPack: a borrowed, zero-copy view of the caller's array, and the
// checks every binding runs on it. A failed check raises TypeError (wrong kind or dtype) or
// ValueError (shape, strides, device, alignment) naming the argument and what it needs. Nothing is
// ever copied or converted: an array that does not fit is refused.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>

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
  // Takes `obj.__dlpack__()` (`stream=-1` for a CUDA array: the op runs on the caller's stream,
  // which the caller orders). TypeError when obj speaks no DLPack.
  ArrayArg(pybind11::handle obj, const char* name);
  ArrayArg(ArrayArg&& other) noexcept;
  ArrayArg(const ArrayArg&) = delete;
  ArrayArg& operator=(const ArrayArg&) = delete;
  ArrayArg& operator=(ArrayArg&&) = delete;
  ~ArrayArg();

  const char* name() const { return name_; }
  Place place() const { return {t().device.type, t().device.id}; }
  Dtype dtype() const;
  int ndim() const { return t().ndim; }
  int64_t dim(int i) const { return t().shape[i]; }
  int64_t stride(int i) const;  // in elements, also for a compact array without strides
  int64_t numel() const;
  void* data() const { return static_cast<uint8_t*>(t().data) + t().byte_offset; }
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
  const dlpack::Tensor& t() const { return managed_->dl_tensor; }
  [[noreturn]] void type_error(const std::string& need) const;
  [[noreturn]] void value_error(const std::string& need) const;

  const char* name_;
  dlpack::ManagedTensor* managed_ = nullptr;
};

// Rows of `width` float32 values, at least `rows` of them, on ref's device; returns the row stride.
int64_t need_f32_rows(const ArrayArg& a, int64_t width, int64_t rows, const ArrayArg& ref);

// The argument named `name` is required but was None.
[[noreturn]] void missing(const char* name, const char* what);

}  // namespace dsa::py
