// Safetensors reading (mmap, full header validation) and writing.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "dsa/error.h"
#include "dsa/file_io.h"
#include "model/json_read.h"

namespace dsa {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // the reference implementation's cap
// A valid header nests 3 levels (header, tensor entry, shape); a few more leave room for metadata.
constexpr int kMaxHeaderDepth = 8;
constexpr uint64_t kMaxDim = uint64_t(1) << 62;

struct DtypeInfo {
  StDtype dtype;
  std::string_view name;
  int size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::kBool, "BOOL", 1},      {StDtype::kU8, "U8", 1},          {StDtype::kI8, "I8", 1},
    {StDtype::kI16, "I16", 2},        {StDtype::kI32, "I32", 4},        {StDtype::kI64, "I64", 8},
    {StDtype::kF8E4M3, "F8_E4M3", 1}, {StDtype::kF8E5M2, "F8_E5M2", 1}, {StDtype::kF16, "F16", 2},
    {StDtype::kBf16, "BF16", 2},      {StDtype::kF32, "F32", 4},        {StDtype::kF64, "F64", 8},
};

const DtypeInfo& info(StDtype d) {
  for (const DtypeInfo& i : kDtypes) {
    if (i.dtype == d) return i;
  }
  fail(ErrorCode::kInternal, "safetensors dtype {} has no table entry", int(d));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// prod(shape) * elem_size, or nullopt on overflow past 2^62.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, int elem_size) {
  unsigned __int128 n = uint64_t(elem_size);
  for (int64_t d : shape) {
    n *= uint64_t(d);
    if (n > (uint64_t(1) << 62)) return std::nullopt;
  }
  return uint64_t(n);
}

}  // namespace

std::optional<StDtype> parse_st_dtype(std::string_view name) {
  for (const DtypeInfo& i : kDtypes) {
    if (i.name == name) return i.dtype;
  }
  return std::nullopt;
}
std::string_view st_dtype_name(StDtype d) { return info(d).name; }
int st_dtype_size(StDtype d) { return info(d).size; }

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const UniqueFd fd = open_regular_file(path, "safetensors file");
  const uint64_t file_bytes = regular_file_size(fd, path, "safetensors file");
  require(file_bytes >= 8, ErrorCode::kIo,
          "safetensors file {} is truncated: {} bytes, too short for the 8-byte header length",
          path, file_bytes);
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  const int map_err = errno;
  require(map != MAP_FAILED, ErrorCode::kIo, "safetensors file {} cannot be mapped: {}", path,
          std::strerror(map_err));
  map_ = map;
  map_bytes_ = file_bytes;
  try {
    const auto* p = static_cast<const uint8_t*>(map_);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | p[i];  // little-endian
    require(header_bytes <= kMaxHeaderBytes, ErrorCode::kIo,
            "safetensors file {}: header length {} exceeds the {}-byte limit (corrupted header "
            "length?)",
            path, header_bytes, kMaxHeaderBytes);
    require(header_bytes <= file_bytes - 8, ErrorCode::kIo,
            "safetensors file {} is truncated: the header length is {} bytes but only {} bytes "
            "follow it",
            path, header_bytes, file_bytes - 8);
    data_offset_ = size_t(8 + header_bytes);
    StHeader header =
        parse_safetensors_header({reinterpret_cast<const char*>(p + 8), size_t(header_bytes)},
                                 file_bytes - data_offset_, path);
    tensors_ = std::move(header.tensors);
    metadata_ = std::move(header.metadata);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      data_offset_(o.data_offset_),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

StHeader parse_safetensors_header(std::string_view text, uint64_t buffer_bytes,
                                  const std::string& path) {
  StHeader out;
  const nlohmann::json header = parse_json_bounded(
      text, kMaxHeaderDepth,
      fmt::format("safetensors file {}: the {}-byte header", path, text.size()), ErrorCode::kIo);
  require(header.is_object(), ErrorCode::kIo,
          "safetensors file {}: the header is a JSON {}, expected an object", path,
          header.type_name());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      require(entry.is_object(), ErrorCode::kIo,
              "safetensors file {}: __metadata__ is a JSON {}, expected an object", path,
              entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        require(value.is_string(), ErrorCode::kIo,
                "safetensors file {}: __metadata__ value of '{}' is not a string", path, key);
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    require(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                entry.contains("data_offsets"),
            ErrorCode::kIo,
            "safetensors file {}: tensor {} needs an object with dtype, shape and data_offsets",
            path, name);
    StTensorInfo t;
    t.name = name;
    const auto& dtype = entry["dtype"];
    require(dtype.is_string(), ErrorCode::kIo,
            "safetensors file {}: tensor {} dtype is not a string", path, name);
    const auto parsed = parse_st_dtype(dtype.get<std::string>());
    require(parsed.has_value(), ErrorCode::kIo,
            "safetensors file {}: tensor {} has unknown dtype '{}'", path, name,
            dtype.get<std::string>());
    t.dtype = *parsed;
    const auto& shape = entry["shape"];
    require(shape.is_array(), ErrorCode::kIo,
            "safetensors file {}: tensor {} shape is not an array", path, name);
    for (const auto& d : shape) {
      require(d.is_number_unsigned(), ErrorCode::kIo,
              "safetensors file {}: tensor {} shape has a dimension {} that is not a "
              "non-negative integer",
              path, name, json_excerpt(d));
      require(d.get<uint64_t>() <= kMaxDim, ErrorCode::kIo,
              "safetensors file {}: tensor {} shape has a dimension {} past the limit 2^62", path,
              name, d.get<uint64_t>());
      t.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    const auto& offsets = entry["data_offsets"];
    require(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                offsets[1].is_number_unsigned(),
            ErrorCode::kIo,
            "safetensors file {}: tensor {} data_offsets {} is not a pair of non-negative "
            "integers",
            path, name, json_excerpt(offsets));
    t.begin = offsets[0].get<uint64_t>();
    t.end = offsets[1].get<uint64_t>();
    require(t.begin <= t.end && t.end <= buffer_bytes, ErrorCode::kIo,
            "safetensors file {}: tensor {} data_offsets [{}, {}] are out of range: the data "
            "buffer holds {} bytes (truncated file?)",
            path, name, t.begin, t.end, buffer_bytes);
    const auto want = byte_size(t.shape, st_dtype_size(t.dtype));
    require(want.has_value() && *want == t.end - t.begin, ErrorCode::kIo,
            "safetensors file {}: tensor {} spans {} bytes, but shape {} of {} needs {}", path,
            name, t.end - t.begin, shape_string(t.shape), st_dtype_name(t.dtype),
            want ? fmt::to_string(*want) : std::string("more than 2^62"));
    out.tensors.emplace(name, std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const StTensorInfo*> by_begin;
  for (const auto& [name, t] : out.tensors) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](const StTensorInfo* a, const StTensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const StTensorInfo& a = *by_begin[i - 1];
    const StTensorInfo& b = *by_begin[i];
    require(b.begin >= a.end || a.begin == a.end || b.begin == b.end, ErrorCode::kIo,
            "safetensors file {}: tensors {} [{}, {}] and {} [{}, {}] overlap", path, a.name,
            a.begin, a.end, b.name, b.begin, b.end);
  }
  return out;
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::span<const uint8_t> SafetensorsFile::bytes(const StTensorInfo& t) const {
  const auto* base = static_cast<const uint8_t*>(map_) + data_offset_;
  return {base + t.begin, size_t(t.end - t.begin)};
}

void write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const StTensorView& t : tensors) {
    require(!header.contains(t.name), ErrorCode::kInvalidArgument,
            "write_safetensors {}: tensor {} is given twice", path, t.name);
    const auto want = byte_size(t.shape, st_dtype_size(t.dtype));
    require(want.has_value() && *want == t.bytes.size(), ErrorCode::kInvalidArgument,
            "write_safetensors {}: tensor {} has {} bytes, shape {} of {} needs {}", path, t.name,
            t.bytes.size(), shape_string(t.shape), st_dtype_name(t.dtype), want.value_or(0));
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  OutputFile out(path, "safetensors file");
  out.write(std::span<const uint8_t>(length, 8));
  out.write(text);
  for (const StTensorView& t : tensors) out.write(t.bytes);
  out.close();
}

}  // namespace dsa
