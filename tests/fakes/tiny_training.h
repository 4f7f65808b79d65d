// What the CPU runtime's trainer tests share: a GPT small enough to train in milliseconds on
// every layout the tests use (8 layers: pp 4 x vp 2; 4 heads: tp 2 and 4), the Shakespeare corpus
// they train on, and the CPU backend factory.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/layout.h"
#include "core/model.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/data.h"
#include "runtime/trainer.h"

namespace ptdp::testing {

// hidden 32, 4 heads, ffn 128, sequence 16, the byte vocabulary (256); `layers` 8 unless given.
inline ModelSpec TinyGpt(int layers = 8) {
  ModelSpec m;
  m.name = "tiny";
  m.layers = layers;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 128;
  m.seq_len = 16;
  m.vocab = 256;
  return m;
}

// The tiny GPT with MoE MLPs (configs/models/gpt-tiny-moe.yaml's shape, smaller): layer 0
// dense, layers 1-3 with 4 experts of width 64, top-2, softmax router, a shared expert of 64.
inline ModelSpec TinyMoe() {
  ModelSpec m = TinyGpt(4);
  m.name = "tiny-moe";
  m.num_experts = 4;
  m.moe_topk = 2;
  m.moe_ffn_hidden = 64;
  m.moe_shared_ffn_hidden = 64;
  m.moe_dense_layers_first = 1;
  return m;
}

// data/tinyshakespeare, 10% held out, seed 17: loaded once per test binary.
inline const rt::TokenCorpus& Shakespeare() {
  static const rt::TokenCorpus corpus = [] {
    auto c = rt::LoadCorpus(std::string(PTDP_SOURCE_DIR) + "/data/tinyshakespeare/input.txt",
                            0.1, 17);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? *c : rt::TokenCorpus{};
  }();
  return corpus;
}

// A layout of the tiny GPT's tests: global batch 8, fp32.
struct TinyLayoutSpec {
  int tp = 1, pp = 1, dp = 1, vp = 1, b = 2;
  bool sp = false, dopt = false;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int cp = 1;
  Recompute recompute = Recompute::kNone;
  int ep = 1, etp = 0;  // MoE models: expert parallel and expert TP (0: Megatron's default, tp)
};
inline Layout TinyLayout(const TinyLayoutSpec& s) {
  Layout l;
  l.tp = s.tp;
  l.pp = s.pp;
  l.dp = s.dp;
  l.vp = s.vp;
  l.micro_batch = s.b;
  l.global_batch = 8;
  l.sequence_parallel = s.sp;
  l.distributed_optimizer = s.dopt;
  l.schedule = s.schedule;
  l.cp = s.cp;
  l.recompute = s.recompute;
  l.ep = s.ep;
  l.etp = s.etp;
  l.precision = Precision::kFp32;
  return l;
}

// A CpuBackend for every rank, its uninitialised outputs filled with NaN (poison_uninit): a
// read of an output before the op writes it turns the run's losses and parameters to NaN.
inline rt::BackendFactory CpuBackends() {
  return [](int) {
    rt::CpuBackendOptions o;
    o.poison_uninit = true;
    return std::unique_ptr<rt::Backend>(new rt::CpuBackend(o));
  };
}

}  // namespace ptdp::testing
