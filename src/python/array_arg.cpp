#include "python/array_arg.h"

#include <fmt/format.h>

#include <tuple>
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

namespace {

// What the attribute path needs from the torch module: its tensor types, the dtypes dsa reads
// (identity-compared) with their DLPack codes, and the C entry point of the current stream. Read
// once per torch module object (sys.modules["torch"]); the references are kept for the process.
struct TorchRefs {
  struct DtypeCode {
    PyObject* dtype;
    uint8_t code, bits;
  };
  PyObject* module = nullptr;
  PyObject* tensor_type = nullptr;
  PyObject* parameter_type = nullptr;
  std::array<DtypeCode, 6> dtypes{};
  int n_dtypes = 0;
  PyObject* raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream, when this torch has it
};

PyObject* interned(const char* s) {
  PyObject* str = PyUnicode_InternFromString(s);
  if (str == nullptr) throw pyb::error_already_set();
  return str;  // kept for the process
}

// sys.modules["torch"], borrowed; null when torch is not imported.
PyObject* torch_module() {
  static PyObject* const key = interned("torch");
  PyObject* mod = PyDict_GetItemWithError(PyImport_GetModuleDict(), key);
  if (mod == nullptr && PyErr_Occurred()) throw pyb::error_already_set();
  return mod;
}

// getattr(obj, name) as a new reference, or null (error cleared) when it has none.
PyObject* attr_or_null(PyObject* obj, const char* name) {
  PyObject* a = PyObject_GetAttrString(obj, name);
  if (a == nullptr) PyErr_Clear();
  return a;
}

// The refs of the torch imported now; null when torch is not imported or lacks what the attribute
// path reads (then every array crosses by DLPack).
const TorchRefs* torch_refs() {
  static TorchRefs refs;  // leaked: holds references for the life of the process
  PyObject* mod = torch_module();
  if (mod == nullptr) return nullptr;
  if (mod == refs.module) return &refs;
  TorchRefs fresh;
  fresh.tensor_type = attr_or_null(mod, "Tensor");
  if (fresh.tensor_type == nullptr || !PyType_Check(fresh.tensor_type)) {
    Py_XDECREF(fresh.tensor_type);
    return nullptr;  // torch half-imported, or no torch: asked again next call
  }
  if (PyObject* nn = attr_or_null(mod, "nn")) {
    fresh.parameter_type = attr_or_null(nn, "Parameter");
    Py_DECREF(nn);
  }
  static constexpr std::array<std::tuple<const char*, uint8_t, uint8_t>, 6> kDtypes = {{
      {"float32", dlpack::kFloat, 32},
      {"bfloat16", dlpack::kBfloat, 16},
      {"uint16", dlpack::kUInt, 16},
      {"uint8", dlpack::kUInt, 8},
      {"int32", dlpack::kInt, 32},
      {"int64", dlpack::kInt, 64},
  }};
  for (const auto& [name, code, bits] : kDtypes) {
    if (PyObject* d = attr_or_null(mod, name)) fresh.dtypes[fresh.n_dtypes++] = {d, code, bits};
  }
  if (PyObject* c = attr_or_null(mod, "_C")) {
    fresh.raw_stream = attr_or_null(c, "_cuda_getCurrentRawStream");
    Py_DECREF(c);
  }
  Py_INCREF(mod);
  fresh.module = mod;
  refs = fresh;  // a previous torch module's references are kept (a few objects, rarely)
  return &refs;
}

// A new reference to getattr(obj, name) (call: obj.name()); null with the error cleared on failure.
PyObject* read(PyObject* obj, PyObject* name, bool call) {
  PyObject* out = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
  if (out == nullptr) PyErr_Clear();
  return out;
}

// A truth value read from obj: 1, 0, or -1 when unreadable.
int read_flag(PyObject* obj, PyObject* name, bool call) {
  PyObject* v = read(obj, name, call);
  if (v == nullptr) return -1;
  const int truth = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (truth < 0) PyErr_Clear();
  return truth;
}

// The ints of a tuple (torch.Size is one) into out[0, n); false when v is no tuple of n ints.
bool tuple_ints(PyObject* v, Py_ssize_t n, int64_t* out) {
  if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != n) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(v, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

bool g_torch_attributes = true;

}  // namespace

void set_torch_attributes(bool enabled) { g_torch_attributes = enabled; }
bool torch_attributes() { return g_torch_attributes; }

ArrayArg::ArrayArg(pyb::handle obj, const char* name, bool keep) : name_(name) {
  if (!g_torch_attributes || !from_torch(obj)) from_capsule(obj);
  if (keep) kept_ = pyb::reinterpret_borrow<pyb::object>(obj);
}

int64_t* ArrayArg::resize_dims(int ndim) {
  ndim_ = ndim;
  if (ndim <= kInlineDims) {
    heap_dims_.clear();
    return inline_dims_.data();
  }
  heap_dims_.assign(2 * size_t(ndim), 0);
  return heap_dims_.data();
}

bool ArrayArg::from_torch(pyb::handle obj) {
  static PyObject* const kDtype = interned("dtype");
  static PyObject* const kRequiresGrad = interned("requires_grad");
  static PyObject* const kIsNeg = interned("is_neg");
  static PyObject* const kIsCuda = interned("is_cuda");
  static PyObject* const kIsCpu = interned("is_cpu");
  static PyObject* const kGetDevice = interned("get_device");
  static PyObject* const kShape = interned("shape");
  static PyObject* const kStride = interned("stride");
  static PyObject* const kDataPtr = interned("data_ptr");
  const TorchRefs* torch = torch_refs();
  if (torch == nullptr) return false;
  PyObject* o = obj.ptr();
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type != torch->tensor_type &&
      (torch->parameter_type == nullptr || type != torch->parameter_type)) {
    return false;  // numpy, a tensor subclass, anything else: DLPack
  }
  PyObject* dtype = read(o, kDtype, false);
  if (dtype == nullptr) return false;
  const TorchRefs::DtypeCode* code = nullptr;
  for (int i = 0; i < torch->n_dtypes; ++i) {
    if (torch->dtypes[size_t(i)].dtype == dtype) code = &torch->dtypes[size_t(i)];
  }
  Py_DECREF(dtype);
  // Another dtype (refused by every op, with a message DLPack's description words best), a tensor
  // that requires grad or has its negative bit set (torch refuses to export those): DLPack. Of the
  // dtypes read here only float32 can carry the negative bit (the .imag of a conjugated complex64
  // view), so only float32 pays for the method call.
  if (code == nullptr || read_flag(o, kRequiresGrad, false) != 0 ||
      (code->code == dlpack::kFloat && read_flag(o, kIsNeg, true) != 0)) {
    return false;
  }
  Place place;
  const int cuda = read_flag(o, kIsCuda, false);
  if (cuda < 0) return false;
  if (cuda) {
    PyObject* index = read(o, kGetDevice, true);
    if (index == nullptr) return false;
    const long id = PyLong_AsLong(index);
    Py_DECREF(index);
    if (id < 0) {
      PyErr_Clear();
      return false;
    }
    place = {dlpack::kCuda, int32_t(id)};
  } else if (read_flag(o, kIsCpu, false) != 1) {
    return false;  // meta, mps, xpu, ...: DLPack says what it is
  }
  // shape and stride() straight into the view's dims; one read of each.
  PyObject* shape = read(o, kShape, false);
  if (shape == nullptr) return false;
  const Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
  int64_t* dims = ndim >= 0 ? resize_dims(int(ndim)) : nullptr;
  const bool shape_ok = dims != nullptr && tuple_ints(shape, ndim, dims);
  Py_DECREF(shape);
  if (!shape_ok) return false;
  PyObject* strides = read(o, kStride, true);
  if (strides == nullptr) return false;
  const bool strides_ok = tuple_ints(strides, ndim, dims + ndim);
  Py_DECREF(strides);
  if (!strides_ok) return false;
  PyObject* ptr = read(o, kDataPtr, true);
  if (ptr == nullptr) return false;
  void* data = PyLong_AsVoidPtr(ptr);
  Py_DECREF(ptr);
  if (data == nullptr && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  data_ = data;
  place_ = place;
  dl_dtype_ = {code->code, code->bits, 1};
  return true;
}

void ArrayArg::from_capsule(pyb::handle obj) {
  static PyObject* const kDlpack = interned("__dlpack__");
  static PyObject* const kDlpackDevice = interned("__dlpack_device__");
  static PyObject* const kStream = interned("stream");
  PyObject* o = obj.ptr();
  // The two methods by interned name, called without pybind11's per-call string and tuple objects.
  // An object without them is refused with the TypeError; any other error they raise propagates.
  const auto speaks_no_dlpack = [&] {
    throw pyb::type_error(fmt::format(
        "argument '{}' must be an array that speaks DLPack (a torch tensor, or a numpy array on "
        "the CPU), got {}",
        name_, type_name(obj)));
  };
  const auto method = [&](PyObject* attr) {
    PyObject* m = PyObject_GetAttr(o, attr);
    if (m == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw pyb::error_already_set();
      PyErr_Clear();
      speaks_no_dlpack();
    }
    return pyb::reinterpret_steal<pyb::object>(m);
  };
  if (obj.is_none()) speaks_no_dlpack();
  const pyb::object dlpack = method(kDlpack);
  const pyb::object device_of = method(kDlpackDevice);
  PyObject* device = PyObject_CallNoArgs(device_of.ptr());
  if (device == nullptr) throw pyb::error_already_set();
  const auto device_ref = pyb::reinterpret_steal<pyb::object>(device);
  if (!PyTuple_Check(device) || PyTuple_GET_SIZE(device) < 1) {
    throw pyb::type_error(
        fmt::format("argument '{}': __dlpack_device__() must return a tuple "
                    "(device type, index), got {}",
                    name_, type_name(device)));
  }
  const long type = PyLong_AsLong(PyTuple_GET_ITEM(device, 0));
  if (type == -1 && PyErr_Occurred()) throw pyb::error_already_set();
  pyb::object capsule;
  if (type == dlpack::kCuda) {  // stream=-1: the op runs on the caller's stream, in its order
    static PyObject* const kw_names = PyTuple_Pack(1, kStream);  // kept for the process
    if (kw_names == nullptr) throw pyb::error_already_set();
    const pyb::int_ minus_one(-1);
    PyObject* args[] = {minus_one.ptr()};
    capsule =
        pyb::reinterpret_steal<pyb::object>(PyObject_Vectorcall(dlpack.ptr(), args, 0, kw_names));
  } else {
    capsule = pyb::reinterpret_steal<pyb::object>(PyObject_CallNoArgs(dlpack.ptr()));
  }
  if (!capsule) throw pyb::error_already_set();
  PyObject* raw = capsule.ptr();
  if (!PyCapsule_IsValid(raw, dlpack::kCapsuleName)) {
    throw pyb::type_error(
        fmt::format("argument '{}': __dlpack__() did not return an unused \"{}\" capsule", name_,
                    dlpack::kCapsuleName));
  }
  managed_ = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(raw, dlpack::kCapsuleName));
  if (managed_ == nullptr) throw pyb::error_already_set();
  // The capsule is consumed: its destructor must not free what this object now owns.
  if (PyCapsule_SetName(raw, dlpack::kUsedCapsuleName) != 0) throw pyb::error_already_set();
  const dlpack::Tensor& t = managed_->dl_tensor;
  data_ = static_cast<uint8_t*>(t.data) + t.byte_offset;
  place_ = {t.device.type, t.device.id};
  dl_dtype_ = t.dtype;
  int64_t* dims = resize_dims(t.ndim);
  int64_t compact = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    dims[i] = t.shape[i];
    dims[ndim_ + i] = t.strides ? t.strides[i] : compact;
    compact *= t.shape[i];
  }
  try {
    need_place_kind();
  } catch (...) {
    if (managed_->deleter) managed_->deleter(managed_);
    managed_ = nullptr;
    throw;
  }
}

ArrayArg::ArrayArg(ArrayArg&& other) noexcept
    : name_(other.name_),
      data_(other.data_),
      place_(other.place_),
      dl_dtype_(other.dl_dtype_),
      ndim_(other.ndim_),
      inline_dims_(other.inline_dims_),
      heap_dims_(std::move(other.heap_dims_)),
      managed_(std::exchange(other.managed_, nullptr)),
      kept_(std::move(other.kept_)) {}

ArrayArg::~ArrayArg() {
  if (managed_ && managed_->deleter) managed_->deleter(managed_);
}

Dtype ArrayArg::dtype() const {
  const dlpack::DataType d = dl_dtype_;
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

int64_t ArrayArg::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim(); ++i) n *= dim(i);
  return n;
}

std::string ArrayArg::describe() const {
  const dlpack::DataType d = dl_dtype_;
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
  return need_value_rows(a, width, rows, ref);
}

int64_t need_value_rows(const ArrayArg& a, int64_t width, int64_t rows, const ArrayArg& ref) {
  a.need_place(ref.place(), ref);
  const int64_t ld = a.need_rows(width);
  if (a.ndim() == 1 || a.dim(0) < rows) {
    throw pyb::value_error(
        fmt::format("argument '{}' needs at least {} rows (one per slot-map row); got {}", a.name(),
                    rows, a.describe()));
  }
  return ld;
}

void need_scalar_i32(const ArrayArg& a, const ArrayArg& ref) {
  a.need_dtype({Dtype::kI32}, "(a one-element device scalar)");
  if (a.numel() != 1) {
    throw pyb::value_error(
        fmt::format("argument '{}' must hold exactly one int32; got {}", a.name(), a.describe()));
  }
  a.need_place(ref.place(), ref);
}

int need_vector(const ArrayArg& a, Dtype dtype, const ArrayArg& ref) {
  a.need_dtype({dtype});
  a.need_ndim({1});
  a.need_contiguous();
  a.need_place(ref.place(), ref);
  if (a.dim(0) > INT32_MAX) {
    throw pyb::value_error(fmt::format("argument '{}' has more than 2^31 - 1 rows", a.name()));
  }
  return int(a.dim(0));
}

void missing(const char* name, const char* what) {
  throw pyb::type_error(fmt::format("argument '{}' is required: {}", name, what));
}

uintptr_t caller_stream(std::optional<uintptr_t> stream, Place place) {
  if (stream) return *stream;
  if (!place.cuda() || torch_module() == nullptr) return 0;
  const TorchRefs* torch = torch_refs();
  if (torch != nullptr && torch->raw_stream != nullptr) {
    PyObject* index = PyLong_FromLong(place.id);
    if (index == nullptr) throw pyb::error_already_set();
    PyObject* handle = PyObject_CallOneArg(torch->raw_stream, index);
    Py_DECREF(index);
    if (handle == nullptr) throw pyb::error_already_set();
    return pyb::reinterpret_steal<pyb::object>(handle).cast<uintptr_t>();
  }
  // An older torch: the public spelling.
  const pyb::object mod = pyb::reinterpret_borrow<pyb::object>(torch_module());
  return mod.attr("cuda").attr("current_stream")(place.id).attr("cuda_stream").cast<uintptr_t>();
}

}  // namespace dsa::py
