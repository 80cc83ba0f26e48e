#include "dsa/backend.h"

#include "dsa/error.h"

namespace dsa {

std::string_view backend_name(BackendKind kind) {
  return kind == BackendKind::kCpu ? "cpu" : "cuda";
}

BackendKind parse_backend(std::string_view name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  fail(ErrorCode::kInvalidArgument, "unknown backend '{}' (expected cpu or cuda)", name);
}

void Backend::copy_rows(const CopyRowsParams& p) {
  for (int r = 0; r < p.rows; ++r) {
    copy_on_device(p.y + r * p.ld_y, p.x + r * p.ld_x, size_t(p.dim) * sizeof(float));
  }
}

void Backend::moe_route(const MoeRouteParams&) {
  fail(ErrorCode::kBackend, "moe_route is not implemented by backend {}", describe());
}

void Backend::scale_rows(const ScaleRowsParams&) {
  fail(ErrorCode::kBackend, "scale_rows is not implemented by backend {}", describe());
}

std::unique_ptr<Backend> make_backend(BackendKind kind) {
  return kind == BackendKind::kCpu ? make_cpu_backend() : make_cuda_backend();
}

#if !defined(DSA_HAVE_CUDA)
bool cuda_available() { return false; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(ErrorCode::kBackend, "this build of dsa has no CUDA backend (configure with DSA_CUDA=ON)");
}
std::unique_ptr<Backend> make_cuda_backend_on_stream(int device, uintptr_t) {
  return make_cuda_backend(device);
}
#endif

}  // namespace dsa
