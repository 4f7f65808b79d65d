// The entry point of lib/ptdp/libptdp_cuda.so: CudaModule (module.h) over the backend, the GPU
// communicators and the MPI bootstrap of this folder. The module's only exported symbol.
#include "runtime/cuda/module.h"

#include <cstring>
#include <utility>

#include "runtime/cuda/ptdp_cuda_abi.h"  // generated: PTDP_CUDA_MODULE_ABI
#if PTDP_HAVE_MPI
#include <mpi.h>
#endif

namespace ptdp::rt::cuda {
namespace {

#if PTDP_HAVE_MPI
class Mpi final : public MpiJob {
 public:
  explicit Mpi(std::unique_ptr<MpiSession> s) : s_(std::move(s)) {}
  int rank() const override { return s_->rank(); }
  int size() const override { return s_->size(); }
  Result<Placement> Place(int gpus_per_process, int gpus_visible) const override {
    return s_->Place(gpus_per_process, gpus_visible);
  }
  Result<bool> AllOk(bool ok) const override { return s_->AllOk(ok); }
  Result<NcclId> ShareNcclId() const override { return s_->ShareNcclId(); }

 private:
  std::unique_ptr<MpiSession> s_;
};
#endif

class Module final : public CudaModule {
 public:
  CudaInfo Probe() const override { return ProbeCuda(); }

  std::string MpiLibrary() const override {
#if PTDP_HAVE_MPI
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "MPI (version unknown)";
    const std::string s(text);  // len counts the terminating NUL with some MPIs
    return s.substr(0, s.find_first_of("\r\n"));
#else
    return "";
#endif
  }

  Result<GpuRank> NewBackend(const CudaBackendOptions& options) const override {
    PTDP_ASSIGN_OR_RETURN(auto b, CudaBackend::Create(options));
    GpuRank r;
    r.stream = b->stream();
    r.backend = std::move(b);
    return r;
  }

  std::unique_ptr<CommunicatorFactory> NewDeviceWorld(int world_size, double timeout_s, int device,
                                                      StreamOf stream_of) const override {
    return std::make_unique<DeviceWorld>(world_size, timeout_s, device, std::move(stream_of));
  }

  Result<NcclId> NewNcclId() const override { return cuda::NewNcclId(); }

  Result<std::unique_ptr<CommunicatorFactory>> NewNcclWorld(
      NcclWorldOptions options) const override {
    PTDP_ASSIGN_OR_RETURN(auto w, NcclWorld::Create(std::move(options)));
    return std::unique_ptr<CommunicatorFactory>(std::move(w));
  }

  Result<std::unique_ptr<MpiJob>> InitMpi() const override {
#if PTDP_HAVE_MPI
    PTDP_ASSIGN_OR_RETURN(auto s, MpiSession::Init(nullptr, nullptr));
    return std::unique_ptr<MpiJob>(std::make_unique<Mpi>(std::move(s)));
#else
    return Status::Error("the CUDA module was built without MPI (install libopenmpi-dev and "
                         "rebuild)");
#endif
  }
};

}  // namespace
}  // namespace ptdp::rt::cuda

extern "C" __attribute__((visibility("default"))) ptdp::rt::cuda::CudaModule* ptdp_cuda_module(
    const char* abi, const char** module_abi) {
  static ptdp::rt::cuda::Module module;
  *module_abi = PTDP_CUDA_MODULE_ABI;
  return abi && std::strcmp(abi, PTDP_CUDA_MODULE_ABI) == 0 ? &module : nullptr;
}
