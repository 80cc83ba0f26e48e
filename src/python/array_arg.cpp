#include "python/array_arg.h"

#include <fmt/format.h>

#include <utility>

namespace dsa::py {
namespace pyb = pybind11;

std::string_view dtype_label(Dtype d) {
  switch (d) {
    case Dtype::kF32:
      return "float32";
    case Dtype::kBf16:
      return "bfloat16";
    case Dtype::kU16:
      return "uint16";
    case Dtype::kU8:
      return "uint8";
    case Dtype::kI32:
      return "int32";
    case Dtype::kI64:
      return "int64";
    case Dtype::kOther:
      return "another dtype";
  }
  return "?";
}

std::string type_name(pyb::handle obj) {
  return std::string(pyb::str(pyb::type::handle_of(obj).attr("__name__")));
}

std::string Place::label() const {
  if (type == dlpack::kCpu) return "cpu";
  if (type == dlpack::kCuda) return fmt::format("cuda:{}", id);
  return fmt::format("DLPack device type {} (index {})", type, id);
}

ArrayArg::ArrayArg(pyb::handle obj, const char* name) : name_(name) {
  if (obj.is_none() || !pyb::hasattr(obj, "__dlpack__") ||
      !pyb::hasattr(obj, "__dlpack_device__")) {
    throw pyb::type_error(fmt::format(
        "argument '{}' must be an array that speaks DLPack (a torch tensor, or a numpy array on "
        "the CPU), got {}",
        name, type_name(obj)));
  }
  const auto device = obj.attr("__dlpack_device__")().cast<pyb::tuple>();
  const int type = device[0].cast<int>();
  pyb::object capsule = type == dlpack::kCuda ? obj.attr("__dlpack__")(pyb::arg("stream") = -1)
                                              : obj.attr("__dlpack__")();
  PyObject* raw = capsule.ptr();
  if (!PyCapsule_IsValid(raw, dlpack::kCapsuleName)) {
    throw pyb::type_error(
        fmt::format("argument '{}': __dlpack__() did not return an unused \"{}\" capsule", name,
                    dlpack::kCapsuleName));
  }
  managed_ = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(raw, dlpack::kCapsuleName));
  if (managed_ == nullptr) throw pyb::error_already_set();
  // The capsule is consumed: its destructor must not free what this object now owns.
  if (PyCapsule_SetName(raw, dlpack::kUsedCapsuleName) != 0) throw pyb::error_already_set();
  try {
    need_place_kind();
  } catch (...) {
    if (managed_->deleter) managed_->deleter(managed_);
    throw;
  }
}

ArrayArg::ArrayArg(ArrayArg&& other) noexcept
    : name_(other.name_), managed_(std::exchange(other.managed_, nullptr)) {}

ArrayArg::~ArrayArg() {
  if (managed_ && managed_->deleter) managed_->deleter(managed_);
}

Dtype ArrayArg::dtype() const {
  const dlpack::DataType d = t().dtype;
  if (d.lanes != 1) return Dtype::kOther;
  switch (d.code) {
    case dlpack::kFloat:
      return d.bits == 32 ? Dtype::kF32 : Dtype::kOther;
    case dlpack::kBfloat:
      return d.bits == 16 ? Dtype::kBf16 : Dtype::kOther;
    case dlpack::kUInt:
      return d.bits == 16 ? Dtype::kU16 : d.bits == 8 ? Dtype::kU8 : Dtype::kOther;
    case dlpack::kInt:
      return d.bits == 32 ? Dtype::kI32 : d.bits == 64 ? Dtype::kI64 : Dtype::kOther;
    default:
      return Dtype::kOther;
  }
}

int64_t ArrayArg::stride(int i) const {
  if (t().strides) return t().strides[i];
  int64_t s = 1;
  for (int j = i + 1; j < ndim(); ++j) s *= dim(j);
  return s;
}

int64_t ArrayArg::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim(); ++i) n *= dim(i);
  return n;
}

std::string ArrayArg::describe() const {
  const dlpack::DataType d = t().dtype;
  static constexpr const char* kCodeNames[] = {"int",    "uint",    "float", "opaque",
                                               "bfloat", "complex", "bool"};
  std::string type = d.code < 7 ? fmt::format("{}{}", kCodeNames[d.code], d.bits)
                                : fmt::format("dtype code {} ({} bits)", d.code, d.bits);
  if (d.lanes != 1) type += fmt::format("x{}", d.lanes);
  std::string shape;
  for (int i = 0; i < ndim(); ++i) shape += fmt::format("{}{}", i ? ", " : "", dim(i));
  return fmt::format("{} [{}] on {}", type, shape, place().label());
}

void ArrayArg::type_error(const std::string& need) const {
  throw pyb::type_error(fmt::format("argument '{}' {}; got {}", name_, need, describe()));
}

void ArrayArg::value_error(const std::string& need) const {
  throw pyb::value_error(fmt::format("argument '{}' {}; got {}", name_, need, describe()));
}

void ArrayArg::need_dtype(std::initializer_list<Dtype> allowed, const char* why) const {
  for (Dtype d : allowed) {
    if (dtype() == d) return;
  }
  std::string list;
  for (Dtype d : allowed) list += fmt::format("{}{}", list.empty() ? "" : " or ", dtype_label(d));
  type_error(fmt::format("must be {}{}{}", list, why ? " " : "", why ? why : ""));
}

void ArrayArg::need_ndim(std::initializer_list<int> allowed) const {
  for (int n : allowed) {
    if (ndim() == n) return;
  }
  std::string list;
  for (int n : allowed) list += fmt::format("{}{}", list.empty() ? "" : " or ", n);
  value_error(fmt::format("must have {} dimensions", list));
}

void ArrayArg::need_dim(int i, int64_t size, const char* what) const {
  if (dim(i) != size) value_error(fmt::format("needs dim {} = {} ({})", i, size, what));
}

void ArrayArg::need_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (dim(i) != 1 && stride(i) != expect) {
      value_error("must be C-contiguous (dsa never copies: pass .contiguous() yourself)");
    }
    expect *= dim(i);
  }
}

int64_t ArrayArg::need_rows(int64_t width) const {
  if (dim(ndim() - 1) != width) {
    value_error(fmt::format("needs a last dim of {}", width));
  }
  int64_t expect = 1;
  for (int i = ndim() - 1; i >= 1; --i) {
    if (dim(i) != 1 && stride(i) != expect) {
      value_error(
          "needs packed rows: unit stride in the last dim, and every dim but the first "
          "packed over the ones after it (only the row stride may be larger)");
    }
    expect *= dim(i);
  }
  const int64_t ld = ndim() == 1 || dim(0) == 1 ? expect : stride(0);
  if (ld < expect) value_error(fmt::format("needs a row stride >= {}", expect));
  return ld;
}

void ArrayArg::need_place(Place p, const ArrayArg& ref) const {
  if (place() == p) return;
  value_error(fmt::format("must be on {} like '{}' (dsa never moves data between devices)",
                          p.label(), ref.name()));
}

void ArrayArg::need_aligned(int bytes) const {
  if (reinterpret_cast<uintptr_t>(data()) % uintptr_t(bytes) != 0) {
    value_error(fmt::format("must start on a {}-byte boundary (a fresh allocation does)", bytes));
  }
}

void ArrayArg::need_place_kind() const {
  if (place().type != dlpack::kCpu && place().type != dlpack::kCuda) {
    value_error("must live in CPU memory or CUDA device memory");
  }
}

int64_t need_f32_rows(const ArrayArg& a, int64_t width, int64_t rows, const ArrayArg& ref) {
  a.need_dtype({Dtype::kF32}, "(dsa's activations are float32; convert explicitly)");
  a.need_place(ref.place(), ref);
  const int64_t ld = a.need_rows(width);
  if (a.ndim() == 1 || a.dim(0) < rows) {
    throw pyb::value_error(
        fmt::format("argument '{}' needs at least {} rows (one per slot-map row); got {}", a.name(),
                    rows, a.describe()));
  }
  return ld;
}

void missing(const char* name, const char* what) {
  throw pyb::type_error(fmt::format("argument '{}' is required: {}", name, what));
}

}  // namespace dsa::py
