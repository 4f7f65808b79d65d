// ThreadWorld: the rendezvous core with the host data plane.
#include "runtime/cpu/thread_communicator.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/bf16.h"

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
  // dst = ((in0 op in1) op in2) ... in fp32; max propagates NaN so that a NaN anywhere is seen
  // everywhere. bf16 is summed in fp32 and rounded once into dst, as DeviceWorld's kernel does
  // (runtime/cuda/device_reduce.cu).
  Status Reduce(void* dst_v, const std::vector<const void*>& in, int64_t count, DType dtype,
                ReduceOp op) override {
    if (dtype == DType::kF32) {
      ReduceInto(static_cast<float*>(dst_v), in, count, op, [](const void* p, int64_t e) {
        return static_cast<const float*>(p)[e];
      });
      return Status::Ok();
    }
    acc_.resize(size_t(count));
    ReduceInto(acc_.data(), in, count, op, [](const void* p, int64_t e) {
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[e]);
    });
    uint16_t* dst = static_cast<uint16_t*>(dst_v);
    for (int64_t e = 0; e < count; ++e) dst[e] = Bf16Bits(acc_[size_t(e)]);
    return Status::Ok();
  }
  Status Finish() override { return Status::Ok(); }
  Result<std::shared_ptr<void>> Allocate(size_t bytes) override {
    return std::shared_ptr<void>(new char[bytes], [](void* p) { delete[] static_cast<char*>(p); });
  }
  std::vector<DType> ReduceDTypes() const override { return {DType::kF32, DType::kBF16}; }

 private:
  template <typename Load>
  static void ReduceInto(float* dst, const std::vector<const void*>& in, int64_t count,
                         ReduceOp op, Load load) {
    for (int64_t e = 0; e < count; ++e) dst[e] = load(in[0], e);
    for (size_t r = 1; r < in.size(); ++r) {
      if (op == ReduceOp::kSum) {
        for (int64_t e = 0; e < count; ++e) dst[e] += load(in[r], e);
      } else {
        for (int64_t e = 0; e < count; ++e) {
          const float x = load(in[r], e);
          if (x > dst[e] || std::isnan(x)) dst[e] = x;
        }
      }
    }
  }
  std::vector<float> acc_;  // a bf16 reduction's fp32 sums
};

}  // namespace

ThreadWorld::ThreadWorld(int world_size, double timeout_s)
    : rendezvous_(world_size, timeout_s, "thread communicator") {}

ThreadWorld::~ThreadWorld() = default;

int ThreadWorld::world_size() const { return rendezvous_.world_size(); }
double ThreadWorld::timeout_s() const { return rendezvous_.timeout_s(); }

bool ThreadWorld::CollectivesBesideCompute() const {
  return 2 * int64_t(world_size()) <= int64_t(std::thread::hardware_concurrency());
}

Result<std::unique_ptr<Communicator>> ThreadWorld::Group(int global_rank,
                                                         const std::vector<int>& ranks,
                                                         const std::string& label) {
  return rendezvous_.Group(global_rank, ranks, label, std::make_unique<HostPlane>());
}

}  // namespace ptdp::rt
