// Files that dsa reads and writes. Inputs must be regular files (a FIFO, a device or a directory
// would hang, read without end or fail with a library message naming nothing) and are read under a
// size limit; outputs are written with every write and the close checked. Every failure is a
// dsa::Error that names the file and what it was for: kIo for an input, kWriteFailed for an output.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace dsa {

// An open file descriptor, closed when it goes out of scope.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Opens `path` for reading; refuses (kIo) anything that is not a regular file, without blocking
// on a FIFO. `what` names the file's role in messages, e.g. "checkpoint config" or "--prompt-file".
UniqueFd open_regular_file(const std::string& path, std::string_view what);

// The size of an open regular file.
uint64_t regular_file_size(const UniqueFd& fd, const std::string& path, std::string_view what);

// Reads a whole regular file of at most max_bytes; kIo naming the size and the limit when larger.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// An output file: created (or truncated), every write and the close checked. A failure (ENOSPC
// on a full disk, /dev/full, EIO, a missing directory) is kWriteFailed naming the file.
class OutputFile {
 public:
  OutputFile(std::string path, std::string_view what);
  ~OutputFile();  // closes without checking when close() was not called (an error is unwinding)
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::span<const uint8_t> bytes);
  void write(std::string_view text);
  void close();  // checked; must be called for the write to count

 private:
  std::string path_, what_;
  int fd_ = -1;
};

// Writes `text` to `path` as one OutputFile.
void write_output_file(const std::string& path, std::string_view text, std::string_view what);

// The machine's physical memory in bytes (0 when unknown).
uint64_t host_memory_bytes();

// "1.5 GB" (decimal gigabytes, one decimal), for memory and size messages.
std::string format_gb(uint64_t bytes);

}  // namespace dsa
