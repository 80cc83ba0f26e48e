// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}},
// then the byte buffer that the offsets index. Reading maps the file and validates everything
// before any tensor is used; every error is a dsa::Error (kIo) naming the file, the tensor and
// the numbers that disagree.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsa {

enum class StDtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kF8E4M3,
  kF8E5M2,
  kF16,
  kBf16,
  kF32,
  kF64
};
std::optional<StDtype> parse_st_dtype(std::string_view name);  // "BF16", "F8_E4M3", ...
std::string_view st_dtype_name(StDtype dtype);
int st_dtype_size(StDtype dtype);  // bytes per element

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kBf16;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
  int64_t numel() const;
};

// A parsed header: the tensors (validated against a data buffer of buffer_bytes) and metadata.
struct StHeader {
  std::map<std::string, StTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};
// Parses and validates the JSON header of a file `path` (named in messages) whose data buffer
// holds buffer_bytes. Nesting deeper than the format's is refused before the JSON parser runs.
// Every error is kIo.
StHeader parse_safetensors_header(std::string_view header, uint64_t buffer_bytes,
                                  const std::string& path);

// A read-only mapping of one safetensors file. Move-only.
class SafetensorsFile {
 public:
  // Maps and validates a regular file (a FIFO or device is refused); throws kIo.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }
  const StTensorInfo* find(const std::string& name) const;  // null when absent
  std::span<const uint8_t> bytes(const StTensorInfo& t) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  size_t data_offset_ = 0;  // 8 + header length
  std::map<std::string, StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes are borrowed and must match prod(shape) * dtype size.
struct StTensorView {
  std::string name;
  StDtype dtype = StDtype::kBf16;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes tensors in the given order, the header padded with spaces to a multiple of 8 bytes so
// the buffer stays aligned. Throws kWriteFailed naming the file when any write or the close fails
// (ENOSPC), kInvalidArgument on a size mismatch or a duplicate name.
void write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace dsa
