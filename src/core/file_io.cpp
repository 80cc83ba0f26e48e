// Checked file input and output (file_io.h).
#include "dsa/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsa/error.h"

namespace dsa {
namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

UniqueFd open_regular_file(const std::string& path, std::string_view what) {
  require(!path.empty(), ErrorCode::kIo, "{}: the file name is empty", what);
  require(path.find('\0') == std::string::npos, ErrorCode::kIo,
          "{}: the file name contains a NUL byte", what);
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  require(fd.get() >= 0, ErrorCode::kIo, "{} {} cannot be opened: {}", what, path,
          std::strerror(errno));
  struct stat st {};
  require(::fstat(fd.get(), &st) == 0, ErrorCode::kIo, "{} {} cannot be read: {}", what, path,
          std::strerror(errno));
  require(S_ISREG(st.st_mode), ErrorCode::kIo, "{} {} is {}; expected a regular file", what, path,
          file_type_name(st.st_mode));
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

uint64_t regular_file_size(const UniqueFd& fd, const std::string& path, std::string_view what) {
  struct stat st {};
  require(::fstat(fd.get(), &st) == 0, ErrorCode::kIo, "{} {} cannot be read: {}", what, path,
          std::strerror(errno));
  return uint64_t(st.st_size);
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  const UniqueFd fd = open_regular_file(path, what);
  const uint64_t size = regular_file_size(fd, path, what);
  require(size <= max_bytes, ErrorCode::kIo, "{} {} is {} bytes; the limit is {} bytes", what, path,
          size, max_bytes);
  std::string text(size_t(size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    require(n >= 0, ErrorCode::kIo, "{} {}: read failed after {} of {} bytes: {}", what, path, done,
            size, std::strerror(errno));
    if (n == 0) break;  // shrank while reading
    done += size_t(n);
  }
  text.resize(done);
  return text;
}

OutputFile::OutputFile(std::string path, std::string_view what)
    : path_(std::move(path)), what_(what) {
  require(!path_.empty(), ErrorCode::kInvalidArgument, "{}: the file name is empty", what_);
  require(path_.find('\0') == std::string::npos, ErrorCode::kInvalidArgument,
          "{}: the file name contains a NUL byte", what_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  require(fd_ >= 0, ErrorCode::kWriteFailed, "{} {} cannot be created: {}", what_, path_,
          std::strerror(errno));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(std::span<const uint8_t> bytes) {
  require(fd_ >= 0, ErrorCode::kInternal, "{} {} is already closed", what_, path_);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, ErrorCode::kWriteFailed, "writing {} {} failed after {} bytes: {}", what_, path_,
            done, n < 0 ? std::strerror(errno) : "no progress");
    done += size_t(n);
  }
}

void OutputFile::write(std::string_view text) {
  write({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

void OutputFile::close() {
  const int fd = fd_;
  fd_ = -1;
  require(fd >= 0, ErrorCode::kInternal, "{} {} is already closed", what_, path_);
  require(::close(fd) == 0, ErrorCode::kWriteFailed, "closing {} {} failed: {}", what_, path_,
          std::strerror(errno));
}

void write_output_file(const std::string& path, std::string_view text, std::string_view what) {
  OutputFile out(path, what);
  out.write(text);
  out.close();
}

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

std::string format_gb(uint64_t bytes) { return fmt::format("{:.1f} GB", double(bytes) / 1e9); }

}  // namespace dsa
