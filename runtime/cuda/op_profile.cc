// Device time per backend op (op_profile.h).
#include "runtime/cuda/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/cuda/cuda_check.h"

namespace ptdp::rt::cuda {

bool OpProfile::Requested() {
  const char* v = std::getenv("PTDP_CUDA_PROFILE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

OpProfile::~OpProfile() {
  for (const Record& r : records_) {
    (void)cudaEventDestroy(r.start);
    (void)cudaEventDestroy(r.end);
  }
  for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
}

cudaEvent_t OpProfile::Take() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

void OpProfile::Begin(const char* op, cudaStream_t st) {
  if (depth_++ > 0 || op == nullptr) return;
  Record r{op, "", 0.0, Take(), Take()};
  if (r.start == nullptr || r.end == nullptr || cudaEventRecord(r.start, st) != cudaSuccess) {
    (void)cudaGetLastError();
    if (r.start != nullptr) pool_.push_back(r.start);
    if (r.end != nullptr) pool_.push_back(r.end);
    r.op = nullptr;  // not recorded; End() below sees no open record
  }
  records_.push_back(r);
}

void OpProfile::End(cudaStream_t st) {
  if (depth_ == 0 || --depth_ > 0 || records_.empty()) return;
  Record& r = records_.back();
  if (r.op == nullptr) {
    records_.pop_back();
    return;
  }
  if (cudaEventRecord(r.end, st) != cudaSuccess) {
    (void)cudaGetLastError();
    pool_.push_back(r.start);
    pool_.push_back(r.end);
    records_.pop_back();
  }
}

void OpProfile::Annotate(const std::string& shape, double flops) {
  // The first annotation wins (an op's own, before the GEMMs it runs inside).
  if (depth_ != 1 || records_.empty() || records_.back().op == nullptr ||
      !records_.back().shape.empty())
    return;
  records_.back().shape = shape;
  records_.back().flops = flops;
}

Status OpProfile::Resolve() {
  // Only closed records: an op still open (Resolve from inside one) waits for the next call.
  const size_t closed = depth_ > 0 && !records_.empty() ? records_.size() - 1 : records_.size();
  Status status;
  for (size_t i = 0; i < closed; ++i) {
    const Record& r = records_[i];
    float ms = 0.0f, gap = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, r.start, r.end);
    if (e == cudaSuccess && i > 0) e = cudaEventElapsedTime(&gap, records_[i - 1].end, r.start);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (status.ok()) status = PTDP_CUDA_STATUS(e);
      continue;
    }
    Total& t = totals_[r.shape.empty() ? std::string(r.op) : std::string(r.op) + " " + r.shape];
    ++t.calls;
    t.ms += double(ms);
    t.flops += r.flops;
    if (i > 0) {
      ++between_.calls;
      between_.ms += double(std::max(gap, 0.0f));
    }
  }
  for (size_t i = 0; i < closed; ++i) {
    pool_.push_back(records_[i].start);
    pool_.push_back(records_[i].end);
  }
  records_.erase(records_.begin(), records_.begin() + std::ptrdiff_t(closed));
  return status;
}

std::string OpProfile::Table(const std::string& device) const {
  if (totals_.empty()) return "";
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  rows.emplace_back("(between ops: communication on the stream, or waiting for the host)", between_);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0.0;
  for (const auto& [name, t] : rows) all += t.ms;
  std::string out = "CUDA op profile, " + device +
                    ": device time per op and shape over the whole run (PTDP_CUDA_PROFILE, "
                    "events around each op)\n";
  char line[512];
  std::snprintf(line, sizeof line, "%7s %11s %8s %10s %8s  %s\n", "share", "total ms", "calls",
                "mean us", "TFLOP/s", "op");
  out += line;
  for (const auto& [name, t] : rows) {
    if (t.calls == 0) continue;
    char rate[32] = "";
    if (t.flops > 0 && t.ms > 0) std::snprintf(rate, sizeof rate, "%.1f", t.flops / (t.ms * 1e9));
    std::snprintf(line, sizeof line, "%6.1f%% %11.3f %8lld %10.1f %8s  %s\n",
                  all > 0 ? 100.0 * t.ms / all : 0.0, t.ms, (long long)t.calls,
                  1e3 * t.ms / double(t.calls), rate, name.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%6.1f%% %11.3f %8s %10s %8s  %s\n", 100.0, all, "", "", "",
                "all");
  out += line;
  return out;
}

}  // namespace ptdp::rt::cuda
