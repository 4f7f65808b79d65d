// ThreadWorld: the rendezvous core with the host data plane.
#include "runtime/cpu/thread_communicator.h"

#include <cmath>
#include <cstring>

namespace ptdp::rt {
namespace {

// Host memory, the calling thread does the work at once: Publish and Finish have nothing to wait
// for (a thread's own writes are visible to the others through the group's mutex).
class HostPlane final : public RankPlane {
 public:
  Status Publish() override { return Status::Ok(); }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  // dst = ((in0 op in1) op in2) ... ; max propagates NaN so that a NaN anywhere is seen
  // everywhere. Only f32 (ReduceDTypes).
  Status Reduce(void* dst_v, const std::vector<const void*>& in, int64_t count, DType dtype,
                ReduceOp op) override {
    float* dst = static_cast<float*>(dst_v);
    std::memcpy(dst, in[0], size_t(count) * sizeof(float));
    for (size_t r = 1; r < in.size(); ++r) {
      const float* x = static_cast<const float*>(in[r]);
      if (op == ReduceOp::kSum) {
        for (int64_t e = 0; e < count; ++e) dst[e] += x[e];
      } else {
        for (int64_t e = 0; e < count; ++e)
          if (x[e] > dst[e] || std::isnan(x[e])) dst[e] = x[e];
      }
    }
    return Status::Ok();
  }
  Status Finish() override { return Status::Ok(); }
  Result<std::shared_ptr<void>> Allocate(size_t bytes) override {
    return std::shared_ptr<void>(new char[bytes], [](void* p) { delete[] static_cast<char*>(p); });
  }
  std::vector<DType> ReduceDTypes() const override { return {DType::kF32}; }
};

}  // namespace

ThreadWorld::ThreadWorld(int world_size, double timeout_s)
    : rendezvous_(world_size, timeout_s, "thread communicator") {}

ThreadWorld::~ThreadWorld() = default;

int ThreadWorld::world_size() const { return rendezvous_.world_size(); }
double ThreadWorld::timeout_s() const { return rendezvous_.timeout_s(); }

Result<std::unique_ptr<Communicator>> ThreadWorld::Group(int global_rank,
                                                         const std::vector<int>& ranks,
                                                         const std::string& label) {
  return rendezvous_.Group(global_rank, ranks, label, std::make_unique<HostPlane>());
}

}  // namespace ptdp::rt
