// GptChunk's private structures shared by runtime/gpt.cc (the dense layer) and runtime/moe.cc
// (the MoE MLP). Not part of the runtime's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/gpt.h"

namespace ptdp::rt {

struct GptChunk::LayerRefs {
  ChunkParam *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
  ChunkParam *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;  // dense layers
  // MoE layers: the router (E, h), the shared experts (null without), and the local experts'
  // weights, fc1 (Fe, h) and fc2 (h, Fe) with Fe = f_e / etp, in expert order.
  bool moe = false;
  ChunkParam *router = nullptr, *shared_fc1 = nullptr, *shared_fc2 = nullptr;
  std::vector<ChunkParam*> expert_fc1 = {}, expert_fc2 = {};
};

// One MoE layer's forward state. Letters: n = sl*b local tokens, k top-k, E experts, G = E/ep
// local experts, R rows this rank's experts compute (received over EP, gathered over expert TP),
// Fe = f_e/etp, Fs = f_s/t. Assignment a = token * k + j (j-th choice of a token).
struct GptChunk::MoeSaved {
  Tensor x;                          // (n, h) the router's and the dispatch's input
  std::vector<int32_t> choice;       // (n k) the expert of each assignment
  std::vector<float> prob;           // (n k) its routing probability
  std::vector<float> score;          // (n k) sigmoid: the selected scores; softmax: unused
  std::vector<double> aux_dlogits;   // (n E) the auxiliary loss's gradient of the logits
  Tensor prob_dev;                   // (n k) prob on the device
  Tensor send_token;                 // (n k) i32: the token of each row sent, in send order
  Tensor send_assignment;            // (n k) i32: the assignment of each row sent
  Tensor send_of;                    // (n k) i32: the send row of assignment a
  Tensor assignment_token;           // (n k) i32: a / k
  std::vector<int64_t> send_rows, recv_rows;  // per EP rank
  std::vector<int64_t> etp_rows;              // rows each expert-TP rank received over EP
  Tensor expert_order;               // (R) i32: row of the gathered set at expert-major row i
  Tensor gathered_order;             // (R) i32: expert-major row of gathered row i
  std::vector<int64_t> expert_rows;  // (G) rows of each local expert, expert-major
  Tensor xe, ze, ae;                 // (R, h), (R, Fe), (R, Fe): expert inputs, fc1, GeLU
  Tensor y;                          // (n k, h) each assignment's expert output
  Tensor shared_z, shared_a;         // (s b, Fs) the shared experts' fc1 and GeLU
  Tensor x_full;                     // (s b, h) the shared experts' input (gathered with SP)
  float aux_scale = 1.0f;            // the auxiliary loss's weight in this micro-batch
};

}  // namespace ptdp::rt
