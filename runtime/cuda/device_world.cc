// DeviceWorld: the rendezvous core with a device data plane (copies and the reduction kernel on
// the rank's stream, stream synchronizations at the publish and finish points).
#include "runtime/cuda/device_world.h"

#include <algorithm>
#include <cassert>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_reduce.h"

namespace ptdp::rt::cuda {
namespace {

class DevicePlane final : public RankPlane {
 public:
  DevicePlane(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  Status Publish() override { return Sync(); }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    PTDP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return PTDP_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  Status Reduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                ReduceOp op) override {
    PTDP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return LaunchReduce(dst, in, count, dtype, op, stream_);
  }
  Status Finish() override { return Sync(); }
  // Device memory; freed (device made current first) when the last holder lets go, which may be
  // after the world is gone (handles keep group state alive).
  Result<std::shared_ptr<void>> Allocate(size_t bytes) override {
    PTDP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    PTDP_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    const int device = device_;
    return std::shared_ptr<void>(p, [device](void* q) {
      (void)cudaSetDevice(device);
      (void)cudaFree(q);  // nothing to report to at this point; cudaFree waits for the device
    });
  }
  std::vector<DType> ReduceDTypes() const override { return {DType::kF32, DType::kBF16}; }

 private:
  Status Sync() {
    PTDP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return PTDP_CUDA_STATUS(cudaStreamSynchronize(stream_));
  }

  int device_;
  cudaStream_t stream_;
};

}  // namespace

DeviceWorld::DeviceWorld(int world_size, double timeout_s, int device, StreamOf stream_of)
    : rendezvous_(world_size, timeout_s, "device communicator"), device_(device),
      stream_of_(std::move(stream_of)) {
  assert(stream_of_);
}

DeviceWorld::~DeviceWorld() = default;

int DeviceWorld::world_size() const { return rendezvous_.world_size(); }
double DeviceWorld::timeout_s() const { return rendezvous_.timeout_s(); }

Result<std::unique_ptr<Communicator>> DeviceWorld::Group(int global_rank,
                                                         const std::vector<int>& ranks,
                                                         const std::string& label) {
  // The core checks the rank list and says what is wrong; only a member's stream is asked for.
  const bool member = std::find(ranks.begin(), ranks.end(), global_rank) != ranks.end();
  if (!member || global_rank < 0 || global_rank >= world_size())
    return rendezvous_.Group(global_rank, ranks, label, nullptr);
  return rendezvous_.Group(global_rank, ranks, label,
                           std::make_unique<DevicePlane>(device_, stream_of_(global_rank)));
}

}  // namespace ptdp::rt::cuda
