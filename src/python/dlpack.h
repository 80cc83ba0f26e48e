// The DLPack C ABI (the published, stable in-memory tensor exchange format), the unversioned form
// that `__dlpack__()` returns by default from torch and numpy: a PyCapsule named "dltensor" holding
// a ManagedTensor*. These are this project's own definitions of those structs; only the field
// order, the field types and the enum values matter, and they are fixed by the format.
//
// Consuming a capsule: take the pointer, rename the capsule "used_dltensor" (so the capsule's
// destructor leaves it alone), and call `deleter(managed)` once the memory is no longer needed;
// that releases the producer's reference to the array.
#pragma once

#include <cstdint>

namespace dsa::py::dlpack {

// DLDeviceType: a C enum, so 4 bytes.
enum DeviceType : int32_t {
  kCpu = 1,
  kCuda = 2,
  kCudaHost = 3,  // pinned host memory: refused here (no op runs on it)
  kCudaManaged = 13,
};

struct Device {
  DeviceType type;
  int32_t id;
};

// DLDataTypeCode
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kOpaque = 3, kBfloat = 4, kBool = 6 };

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;  // the allocation; the first element is at data + byte_offset
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;    // [ndim]
  int64_t* strides;  // [ndim] in elements, or null for a compact row-major array
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

inline constexpr const char* kCapsuleName = "dltensor";
inline constexpr const char* kUsedCapsuleName = "used_dltensor";

}  // namespace dsa::py::dlpack
