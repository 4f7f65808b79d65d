// Closed-form step time, FLOPs and memory. Sources: Narayanan et al. 2021 (arXiv 2104.04473)
// eq. 2-3 and sec. 3; Korthikanti et al. 2022 (arXiv 2205.05198) table 2 and sec. 6;
// ../shared/reference/megatron-reference.md; constants in hardware_table.h.
#include "cost_model/analytic.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdio>

#include "core/schedule.h"

namespace ptdp {

namespace {

double ModelFwdFlopsPerToken(const ModelSpec& M);  // below, with the FLOP counts

// What stays exposed of `total` seconds of n collectives run one after another beside a window
// of `window` seconds whose j-th part needs (or produces) the j-th of them at j/n of it:
// max(total/n, total - window (1 - 1/n)) (DpExposed's law, without its interference term).
double ExposedBeside(double total, int n, double window) {
  if (n <= 1) return total;
  return std::max(total / n, total - window * (1 - 1.0 / n));
}

double ActBytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }
double WeightBytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }
// The 16-bit precision an fp8 or fp4 run computes everything but its GEMMs in.
Precision SixteenBit(Precision p) {
  return p == Precision::kFp8 || p == Precision::kFp4 ? Precision::kBf16 : p;
}

}  // namespace

// The members are ranks 0, stride, ..., (size-1)*stride (every other group of the kind is this
// one shifted). With stride < gpus_per_node the first node holds ceil(gpus_per_node / stride)
// of them, and they span floor((size-1)*stride / gpus_per_node) + 1 nodes; a stride of a node
// or more puts each on its own node. Counting nodes by the span, not by size / per_node, is
// what keeps a stride that does not divide the node on it. Megatron's rank = tp + t*(dp + d*pp)
// and its embedding group is the first and last PP rank (megatron-reference.md section 2), so
// at pp 4 x dp 2 it is ranks 0 and 6, stride t*c*d*(p-1) = 6, on one 8-GPU node; size / (8 / 6)
// made it two nodes, and on a one-node cluster that asked the absent network for its
// bandwidth (0: an infinite, or 0/0, collective time; issue 12). A "node" here is an NVLink
// domain (Coll passes ClusterSpec::nvlink_domain_gpus: 8 on a DGX, 72 on a GB200 NVL72 rack),
// as in topology.h's GroupShape: a group on several trays of one rack is an NVLink group.
GroupShape RegularGroupShape(int stride, int size, int gpus_per_node) {
  GroupShape g;
  g.size = size;
  if (size <= 1) return g;
  if (stride >= gpus_per_node) {
    g.per_node = 1;
    g.nodes = size;
  } else {
    g.per_node = std::min(size, (gpus_per_node + stride - 1) / stride);
    g.nodes = int(int64_t(size - 1) * stride / gpus_per_node) + 1;
  }
  g.sharing = g.nodes == 1 ? 1 : std::max(1, gpus_per_node / g.per_node);
  return g;
}

Status CheckEstimate(const Layout& l, const Estimate& e) {
  const Breakdown& b = e.breakdown;
  const MemoryBytes& m = e.memory;
  // (name, value, must be > 0 rather than >= 0)
  struct Term { const char* name; double v; bool positive; };
  const Term terms[] = {
      {"compute_s", b.compute_s, false},         {"tp_comm_s", b.tp_comm_s, false},
      {"pp_comm_s", b.pp_comm_s, false},         {"dp_comm_s", b.dp_comm_s, false},
      {"bubble_s", b.bubble_s, false},           {"optimizer_s", b.optimizer_s, false},
      {"step_time_s", e.step_time_s, true},      {"bubble_fraction", e.bubble_fraction, false},
      {"mfu", e.mfu, false},                     {"memory.weights", m.weights, false},
      {"memory.grads", m.grads, false},          {"memory.optimizer", m.optimizer, false},
      {"memory.activations", m.activations, false}, {"memory.other", m.other, false},
      {"memory.total", m.total, true}};
  for (const Term& t : terms) {
    if (std::isfinite(t.v) && (t.positive ? t.v > 0 : t.v >= 0)) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, ": %s is %g (step_time_s %g): not a finite, %s figure",
                  t.name, t.v, e.step_time_s, t.positive ? "positive" : "non-negative");
    return Status::Error("cost model: " + l.ShortName() + " [" + l.Knobs() + "]" + buf);
  }
  return Status::Ok();
}

Result<AnalyticModel> AnalyticModel::Create(const ModelSpec& model, const Topology& topo) {
  PTDP_ASSIGN_OR_RETURN(CostConstants k, ConstantsFor(topo.spec()));
  const MeasuredPrimitives& m = topo.spec().measured;
  if (!m.empty()) {
    PTDP_RETURN_IF_ERROR(m.CheckComplete(topo.spec().file));
    // The measured primitives time ptdp's own runtime, which trains GPT shapes only.
    PTDP_RETURN_IF_ERROR(CheckGptShaped(model).Prefixed(
        topo.spec().file + ": measured: (the primitives of ptdp's runtime)"));
  }
  return AnalyticModel(model, topo, k);
}

AnalyticModel::AnalyticModel(const ModelSpec& model, const Topology& topo,
                             const CostConstants& k)
    : model_(model), topo_(&topo), k_(k) {
  ResetMemo();
  layer_params_.dense_layer = double(model.params_per_layer());
  for (int k = 0; k < kLayerKinds; ++k)
    layer_params_.kind[size_t(k)] = double(model.kind_params(LayerKind(k)));
  fwd_flops_per_token_ = ModelFwdFlopsPerToken(model);
  const LayerCounts all = model.layer_counts(0, model.layers);
  attention_layers_ = all.attention();
  dense_mlp_layers_ = all[LayerKind::kDense] + all[LayerKind::kMlp];
  moe_layers_ = all.moe();
  if (model.hybrid()) {
    auto before = std::make_shared<std::vector<LayerCounts>>(size_t(model.layers) + 1);
    for (int64_t i = 0; i < model.layers; ++i) {
      (*before)[size_t(i) + 1] = (*before)[size_t(i)];
      (*before)[size_t(i) + 1][model.layer_kind(i)] += 1;
    }
    kinds_before_ = std::move(before);
  }
  if (model.moe()) {
    layer_params_.routed = double(model.routed_expert_params());
    layer_params_.latent = double(model.latent_params());
    layer_params_.moe_layer_shared =
        double(model.attention_params() + model.moe_mlp_params()) - layer_params_.routed;
  }
  const ClusterSpec& c = topo.spec();
  if (!c.measured.empty() && c.measured.CheckComplete(c.file).ok())
    runtime_ = std::make_shared<RuntimeModel>(model, c.measured, c.gpus_per_node);
}

double AnalyticModel::PeakFlops(Precision p) const {
  double peak = topo_->spec().gpu.PeakFlops(p);
  if (peak <= 0) peak = topo_->spec().gpu.PeakFlops(Precision::kBf16);
  return peak;
}

double AnalyticModel::MfuPeak(Precision p) const {
  // NeMo and the dgxc recipes quote fp8 MFU against the 16-bit peak; so do we (fp4 too).
  return PeakFlops(SixteenBit(p));
}

// A GEMM's output is cut into tiles that run in waves over the SMs, each wave one tile's
// k-loop at the per-SM peak times eff_max * k / (k + half) (Nvidia's "Matrix Multiplication
// Background User's Guide": tile and wave quantization). The tile is the one of 128x128,
// 128x256, 256x128 that finishes first, as cuBLAS's heuristics pick. Without the GPU's SM
// count: 2mnk / (peak * eff).
double AnalyticModel::Gemm(double m, double n, double k, Precision p) const {
  // fp8 and fp4 GEMMs at their own peaks and efficiencies (scaling and casts).
  const double eff_max =
      p == Precision::kFp4 ? k_.gemm_eff_max_fp4
      : p == Precision::kFp8 ? k_.gemm_eff_max_fp8 : k_.gemm_eff_max;
  const double eff = eff_max * k / (k + k_.gemm_half_dim);
  const double peak = PeakFlops(p) * eff;
  const int sms = topo_->spec().gpu.sms;
  if (sms <= 0) return 2.0 * m * n * k / peak;
  // Tiles {m, n} in units of 64 and their throughput relative to 128x128: below 128x128 a
  // tile's operand loads per FLOP grow as 1/tm + 1/tn; its rate is taken as the square root of
  // its arithmetic intensity relative to 128x128 (64x128: 0.82, 64x64: 0.71).
  struct Tile { int64_t m64, n64; double time_factor; };  // area / rate, in 128x128 units
  static constexpr Tile kTiles[6] = {{2, 2, 1.0},          {2, 4, 2.0},          {4, 2, 2.0},
                                     {1, 2, 0.5 / 0.8165}, {2, 1, 0.5 / 0.8165}, {1, 1, 0.25 / 0.7071}};
  // Blocks of 64 along m and n (exact: m and n are whole numbers of elements).
  const int64_t bm = int64_t(std::ceil(m * (1.0 / 64))), bn = int64_t(std::ceil(n * (1.0 / 64)));
  // Seconds per wave of 128x128 tiles; a tile's k-loop is the same for every tile size.
  const double wave128 = 2.0 * 128 * 128 * k * sms / peak;
  const double ideal = wave128 * m * n / (128.0 * 128.0 * sms);  // no quantization, rate 1
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    const Tile& tile = kTiles[i];
    const int64_t tiles = ((bm + tile.m64 - 1) / tile.m64) * ((bn + tile.n64 - 1) / tile.n64);
    const int64_t waves = (tiles + sms - 1) / sms;
    const double t = double(waves) * wave128 * tile.time_factor;
    if (best == 0 || t < best) best = t;
    // The smaller tiles (rate <= 0.8165) take at least the unquantized time / 0.8165: once
    // the big tiles' best is within that, they cannot win (most GEMMs of large layers).
    if (i == 2 && best * 0.8165 <= ideal) break;
  }
  return best;
}

// Collective time with NCCL's achievable share of the link: latency + bytes / (bw * eff).
double AnalyticModel::Coll(Collective c, int stride, int size, double bytes) const {
  if (size <= 1 || bytes <= 0) return 0;
  const GroupShape g = RegularGroupShape(stride, size, topo_->spec().nvlink_domain_gpus());
  // The layout's world fits the cluster (Evaluate's precondition), so its groups do too: a
  // group on more nodes than exist would be timed on a network that is not there.
  assert(g.nodes <= topo_->spec().nodes);
  const double lat = topo_->CollectiveTime(c, g, 0);
  const double full = topo_->CollectiveTime(c, g, bytes);
  const double eff = g.nodes > 1 ? k_.nccl_inter_eff : k_.nccl_intra_eff;
  return k_.collective_overhead_s + lat + (full - lat) / eff;
}

OpShape AnalyticModel::Shape(const Layout& l) const {
  if (runtime_) {  // the runtime's ops; dropless routing's slowest expert rank as on GPUs
    OpShape s = runtime_->Shape(l);
    if (model_.moe()) s.expert_load = ExpertLoad(l);
    return s;
  }
  OpShape s = ShapeOf(l, k_.softmax_bytes_per_score);
  if (model_.moe()) {
    s.ep = l.ep;
    s.etp = l.expert_tp();
    s.expert_load = ExpertLoad(l);
  }
  return s;
}

double AnalyticModel::ExpertLoad(const Layout& l) const {
  switch (model_.moe_routing) {
    case MoeRouting::kBalanced: return 1.0;
    case MoeRouting::kCapacity: return model_.moe_capacity_factor;  // padded to capacity
    // Dropless: a rank waits for the most loaded EP rank; at ep 1 the one rank holds every
    // expert and computes exactly the routed rows (T k), whatever the routing.
    case MoeRouting::kDropless: return l.ep > 1 ? k_.moe_dropless_load : 1.0;
  }
  return 1.0;
}

double AnalyticModel::AllToAll(int stride, int size, double bytes, bool flex) const {
  if (size <= 1 || bytes <= 0) return 0;
  const int domain = topo_->spec().nvlink_domain_gpus();
  const GroupShape g = RegularGroupShape(stride, size, domain);
  assert(g.nodes <= topo_->spec().nodes);
  // Peers in this rank's NVLink domain and beyond it; each gets bytes / size.
  const int local = g.nodes <= 1 ? size : g.per_node;
  GroupShape in_domain;
  in_domain.size = local;
  const double nvl_bw = local > 1 ? topo_->BusBandwidth(in_domain) : 0;
  const double per_peer = bytes / size;
  double t = local > 1 ? per_peer * (local - 1) / (nvl_bw * k_.nccl_intra_eff) : 0;
  double lat = local > 1 ? topo_->CollectiveTime(Collective::kSendRecv, in_domain, 0) : 0;
  if (g.nodes > 1) {
    // Every rank of the domain sends its remote share at once: each gets its share of the
    // domain's NICs (a ring, in contrast, runs one transfer per NIC along the ring).
    const ClusterSpec& c = topo_->spec();
    const double nic_bw = double(c.inter.nics_per_node) * c.nodes_per_nvlink_domain *
                          c.inter.nic_bw_bytes_per_s / c.inter.oversubscription / domain;
    double remote = per_peer * (size - local);
    if (flex && model_.moe_topk > 1) {
      // DeepEP / HybridEP: a token goes once to each remote domain holding one of its k experts
      // (uniform routing over the g.nodes domains: N (1 - (1 - 1/N)^k) distinct domains), and
      // the receiving domain forwards the copies over NVLink.
      const double N = g.nodes, k = double(model_.moe_topk);
      const double distinct_remote = (N - 1) * (1 - std::pow(1 - 1 / N, k));
      remote = bytes / k * distinct_remote;
      if (local > 1) t += per_peer * (size - local) / (nvl_bw * k_.nccl_intra_eff);
    }
    t = std::max(t, remote / (nic_bw * k_.nccl_inter_eff));
    lat = std::max(lat, c.inter.latency_s);
  }
  return k_.collective_overhead_s + lat + t / k_.all_to_all_eff;
}

LayerOps AnalyticModel::Ops(const Layout& l) const {
  LayerOps ops;
  BuildLayerOps(model_, Shape(l), &ops);
  return ops;
}

OpListTimes AnalyticModel::TimeOps(const Layout& l, const LayerOpList& ops,
                                   const OpListTimes& before, OpTimes* each,
                                   CollCache* colls) const {
  OpListTimes r = before;
  if (runtime_) {  // ptdp's runtime on measured primitives: each op by its table, all blocking
    for (int i = 0; i < ops.size; ++i) {
      const LayerOp& op = ops[i];
      const double t = runtime_->TimeOp(l, op);
      if (op.kind == LayerOpKind::kComm) {
        r.exposed_s += t;
        if (each) (*each)[i].comm_s = t, (*each)[i].exposed_s = t;
      } else {
        r.compute_s += t;
        if (each) (*each)[i].gpu_s = t;
      }
      r.kernels += op.kernels;
      r.busy_s += t;
      if (each) (*each)[i].end_s = r.busy_s;
    }
    return r;
  }
  const double hbm = topo_->spec().gpu.hbm_bw_bytes_per_s * k_.hbm_eff;
  const Precision prec = l.precision;
  const double peak16 = PeakFlops(SixteenBit(prec));
  std::array<double, LayerOpList::kMax> gpu;  // filled below for every op (0 for comm)
  for (int i = 0; i < ops.size; ++i) {
    const LayerOp& op = ops[i];
    double t = 0;
    switch (op.kind) {
      // A grouped GEMM's experts share the waves: their tiles as one GEMM n x groups wide.
      case LayerOpKind::kGemm:
        t = Gemm(op.m, op.n * op.groups, op.k, op.quantized ? prec : SixteenBit(prec)) /
            (op.expert ? k_.grouped_gemm_eff : 1.0);
        break;
      case LayerOpKind::kAttention: t = op.flops / (peak16 * k_.attention_eff); break;
      case LayerOpKind::kMemory: {
        if (op.kernel == MemoryKernel::kSsmScan || op.kernel == MemoryKernel::kSsmScanBackward) {
          // A chain of kernels, some moving bytes (conv1d, cumsum, state passing, the norm),
          // some doing the FLOPs (chunk state, C B^T, chunk scan): their times add.
          t = op.bytes / hbm + op.flops / (peak16 * k_.ssm_scan_eff);
          break;
        }
        const bool norm_like = op.kernel == MemoryKernel::kNorm ||
                               op.kernel == MemoryKernel::kPermute ||
                               op.kernel == MemoryKernel::kPermuteBackward ||
                               op.kernel == MemoryKernel::kNormBackward ||
                               op.kernel == MemoryKernel::kBiasDropoutAdd ||
                               op.kernel == MemoryKernel::kBiasDropoutAddBackward;
        t = op.bytes * (norm_like ? k_.elementwise_replicated : k_.elementwise_tp_split) / hbm;
        break;
      }
      case LayerOpKind::kComm: gpu[i] = 0; continue;
    }
    gpu[i] = t + op.kernels * k_.kernel_overhead_s;
  }
  CollCache local;
  CollCache& cc = colls ? *colls : local;
  // The host issues the ops asynchronously (PyTorch eager: no host sync inside a layer) and
  // runs ahead of a GPU-bound stream across layers and micro-batches, so in steady state a
  // list takes max(GPU time, host time): the GPU's kernels plus exposed communication, or
  // the host's dispatch when that is longer (small layers, small micro-batches).
  for (int i = 0; i < ops.size; ++i) {
    const LayerOp& op = ops[i];
    double gpu_time = gpu[i], host = op.kernels * k_.host_kernel_s;
    if (op.kind == LayerOpKind::kComm) {
      // Groups (megatron-reference.md section 2, parallel folding): TP consecutive ranks, CP t
      // apart; the expert grid's ETP consecutive, EP etp apart.
      int size = l.tp, stride = 1;
      switch (op.group) {
        case CommGroup::kTp: break;
        case CommGroup::kCp: size = l.cp; stride = l.tp; break;
        case CommGroup::kEtp: size = l.expert_tp(); break;
        case CommGroup::kEp: size = l.ep; stride = l.expert_tp(); break;
        case CommGroup::kTpCp: size = l.tp * l.cp; break;  // the runtime's only
      }
      const Collective kind = op.comm == CommKind::kAllReduce   ? Collective::kAllReduce
                              : op.comm == CommKind::kAllGather ? Collective::kAllGather
                              : op.comm == CommKind::kAllToAll  ? Collective::kAllToAll
                                                                : Collective::kReduceScatter;
      // The same collective recurs (4 of T h per layer): time each distinct one once.
      double c = -1;
      for (int j = 0; j < cc.size; ++j)
        if (cc.entries[j].kind == kind && cc.entries[j].group == uint8_t(op.group) &&
            cc.entries[j].bytes == op.bytes)
          c = cc.entries[j].seconds;
      if (c < 0) {
        c = kind == Collective::kAllToAll
                ? AllToAll(stride, size, op.bytes,
                           op.group == CommGroup::kEp && l.moe_flex_dispatcher)
                                          : Coll(kind, stride, size, op.bytes);
        if (cc.size < CollCache::kMax)
          cc.entries[cc.size++] = {kind, uint8_t(op.group), op.bytes, c};
      }
      if (c <= 0) continue;
      host = k_.host_collective_s;
      const double g = op.with >= 0 ? gpu[op.with] : 0;
      double exposed = c;
      switch (op.overlap) {
        case CommOverlap::kBlocking: break;
        case CommOverlap::kAsync:
        case CommOverlap::kRing:
          exposed = std::max(0.0, c - g) + k_.overlap_interference * std::min(c, g);
          break;
        case CommOverlap::kTpOverlap:
          // --tp-comm-overlap: `chunks` pieces pipelined against the GEMM's pieces; the first
          // (ring-exchange) or last (pipelined reduce-scatter) piece cannot hide.
          if (l.tp_comm_overlap)
            exposed = std::max(0.0, c - g) + std::min(c, g) / std::max(1, op.chunks) +
                      k_.overlap_interference * std::min(c, g);
          break;
      }
      r.exposed_s += exposed;
      r.hidden_s += c - std::min(c, exposed);
      gpu_time = exposed;
      if (each) (*each)[i].comm_s = c, (*each)[i].exposed_s = exposed;
    } else {
      r.compute_s += gpu_time;
      if (each) (*each)[i].gpu_s = gpu_time;
    }
    r.host_s += host;
    r.kernels += op.kernels;
    r.busy_s += gpu_time;
    if (each) (*each)[i].host_s = host, (*each)[i].end_s = r.busy_s;
  }
  return r;
}

void AnalyticModel::ResetMemo() {
  static std::atomic<uint64_t> next_id{0};
  id_ = ++next_id;
}

// A layer's times depend on these fields of a layout only (ShapeOf and TimeOps read no other),
// and the planner asks for the same few thousands of times: a small memo per thread.
LayerTimes AnalyticModel::Layer(const Layout& l) const {
  struct Key {
    uint64_t model;
    int world;  // the measured runtime's layer time depends on the ranks sharing a node
    int tp, cp, micro_batch, ep, etp;
    bool sp, tp_comm_overlap, a2a_overlap, flex;
    CrossEntropyFusion cross_entropy;
    Recompute recompute;
    uint8_t recompute_modules;
    Precision precision;
    bool operator==(const Key&) const = default;
  };
  struct Entry {
    Key key;
    LayerTimes times;
  };
  // Direct-mapped by a hash of the key: 2048 slots (~280 KB per thread; a 1024-GPU search
  // of GPT-3 175B meets ~500 distinct layers).
  static constexpr size_t kSlots = 2048;
  thread_local std::array<Entry, kSlots> memo{};
  const Key key{id_, runtime_ ? l.world() : 0, l.tp, l.cp, l.micro_batch,
                model_.moe() ? l.ep : 1, model_.moe() ? l.expert_tp() : 1,
                l.sequence_parallel && l.tp > 1, l.tp_comm_overlap, l.moe_a2a_overlap,
                l.moe_flex_dispatcher, l.cross_entropy, l.recompute, l.RecomputedModules(),
                l.precision};
  uint64_t h = key.model;
  for (uint64_t v : {uint64_t(key.world), uint64_t(key.tp), uint64_t(key.cp),
                     uint64_t(key.micro_batch), uint64_t(key.ep) * 4096 + uint64_t(key.etp),
                     uint64_t(key.sp) * 8 + key.tp_comm_overlap * 4 + key.a2a_overlap * 2 +
                         key.flex,
                     uint64_t(key.recompute) * 8 + uint64_t(key.precision) +
                         uint64_t(key.recompute_modules) * 64 +
                         uint64_t(key.cross_entropy) * 16384}) {
    h = (h ^ v) + 0x9E3779B97F4A7C15ull;  // splitmix64's finaliser per field
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  Entry& e = memo[h % kSlots];
  if (e.key == key) return e.times;
  e = {key, ComputeLayer(l)};
  return e.times;
}

OneLayerTimes AnalyticModel::KindTimes(const Layout& l, LayerKind kind, CollCache* colls) const {
  LayerOps ops;
  BuildLayerOps(model_, Shape(l), &ops, kind);
  const bool a2a_overlap = HasMoe(kind) && l.moe_a2a_overlap;
  OpTimes ef, eb;  // each op's times, read only with the all-to-all overlap
  const OpListTimes f = TimeOps(l, ops.forward, {}, a2a_overlap ? &ef : nullptr, colls);
  const OpListTimes rc = TimeOps(l, ops.recompute, {}, nullptr, colls);
  const OpListTimes br = TimeOps(l, ops.backward, rc, a2a_overlap ? &eb : nullptr, colls);
  // The GPU waits for a host that dispatches slower than it computes: the difference counts as
  // compute (the kernels are there, only later).
  OneLayerTimes t;
  t.fwd_compute_s = f.busy() - f.exposed_s;
  t.bwd_compute_s = br.busy() - br.exposed_s;
  t.recompute_s = rc.busy();
  t.fwd_tp_s = f.exposed_s;
  t.bwd_tp_s = br.exposed_s;
  if (a2a_overlap) {
    // --overlap-moe-expert-parallel-comm: one micro-batch's forward and another's backward
    // run layer by layer together, each one's all-to-alls under the other's compute
    // (megatron/core/pipeline_parallel/ combined 1F1B): what the pair's compute cannot cover
    // stays exposed, the hidden rest costs overlap_interference.
    auto a2a = [](const LayerOpList& ops, const OpTimes& t) {
      double s = 0;
      for (int i = 0; i < ops.size; ++i)
        if (ops[i].kind == LayerOpKind::kComm && ops[i].comm == CommKind::kAllToAll &&
            ops[i].group == CommGroup::kEp)
          s += t[i].exposed_s;
      return s;
    };
    const double af = a2a(ops.forward, ef), ab = a2a(ops.backward, eb);
    const double window = t.fwd_compute_s + t.bwd_compute_s;
    const double left = std::max(0.0, af + ab - window);
    const double hidden = af + ab - left;
    t.fwd_tp_s -= af;
    t.bwd_tp_s += left - ab + k_.overlap_interference * hidden;
  }
  t.fwd_gpu_s = f.busy_s - f.exposed_s + t.fwd_tp_s;
  t.bwd_gpu_s = br.busy_s - br.exposed_s + t.bwd_tp_s;
  t.fwd_host_s = f.host_s;
  t.bwd_host_s = br.host_s;
  return t;
}

LayerTimes AnalyticModel::ComputeLayer(const Layout& l) const {
  CollCache colls;  // the same collectives recur across the lists: time each once
  LayerTimes lt;
  auto set_top = [&lt](const OneLayerTimes& t) {
    lt.fwd_compute_s = t.fwd_compute_s;
    lt.bwd_compute_s = t.bwd_compute_s;
    lt.recompute_s = t.recompute_s;
    lt.fwd_tp_s = t.fwd_tp_s;
    lt.bwd_tp_s = t.bwd_tp_s;
  };
  if (model_.hybrid()) {
    // Each kind the pattern has, and the mean layer in the top-level fields.
    const LayerCounts all = model_.layer_counts(0, model_.layers);
    OneLayerTimes mean;
    for (int k = 0; k < kLayerKinds; ++k) {
      const double n = all.n[size_t(k)];
      if (n <= 0) continue;
      const OneLayerTimes t = KindTimes(l, LayerKind(k), &colls);
      lt.kinds[size_t(k)] = t;
      const double w = n / double(model_.layers);
      mean.fwd_compute_s += w * t.fwd_compute_s;
      mean.bwd_compute_s += w * t.bwd_compute_s;
      mean.recompute_s += w * t.recompute_s;
      mean.fwd_tp_s += w * t.fwd_tp_s;
      mean.bwd_tp_s += w * t.bwd_tp_s;
    }
    set_top(mean);
    lt.moe = lt.kinds[size_t(LayerKind::kMoeMlp)];
  } else {
    set_top(KindTimes(l, LayerKind::kDense, &colls));
    if (model_.moe()) lt.moe = KindTimes(l, LayerKind::kMoe, &colls);
  }
  const OpShape shape = Shape(l);
  // The embedding and the output layer, each a forward and a backward list.
  LayerOpList fwd, bwd;
  auto pass = [&](PassTimes* p) {
    const OpListTimes tf = TimeOps(l, fwd, {}, nullptr, &colls),
                      tb = TimeOps(l, bwd, {}, nullptr, &colls);
    p->fwd_compute_s = tf.busy() - tf.exposed_s;
    p->fwd_tp_s = tf.exposed_s;
    p->bwd_compute_s = tb.busy() - tb.exposed_s;
    p->bwd_tp_s = tb.exposed_s;
  };
  BuildEmbeddingOps(model_, shape, &fwd, &bwd);
  pass(&lt.embedding);
  BuildOutputOps(model_, shape, &fwd, &bwd);
  pass(&lt.output);
  BuildStageInputOps(model_, shape, &fwd, &bwd);
  pass(&lt.input);
  if (model_.mtp_layers > 0) {
    // DeepSeek-V3 sec. 2.2: per MTP module, the two norms and the 2h x h projection of the
    // concatenated hidden state and next-token embedding (a GEMM of T x h x 2h), then the
    // shared output layer and cross entropy once more.
    BuildOutputOps(model_, shape, &fwd, &bwd);
    pass(&lt.mtp);
    const double T = double(l.micro_batch) * model_.seq_len / l.cp, h = double(model_.hidden);
    const double proj = Gemm(T, h / l.tp, 2 * h, l.precision);
    lt.mtp.fwd_compute_s += proj;
    lt.mtp.bwd_compute_s += 2 * proj;
  }
  return lt;
}

StageTimes AnalyticModel::Stage(const Layout& l, int r) const { return StageFrom(l, r, Layer(l)); }

StageTimes AnalyticModel::StageFrom(const Layout& l, int r, const LayerTimes& lt) const {
  return Work(l, RankLayerCounts(l, r), r == 0, r == l.pp - 1, lt);
}

StageTimes AnalyticModel::Chunk(const Layout& l, int r, int c, const LayerTimes& lt) const {
  return Work(l, ChunkLayerCounts(l, r, c), r == 0 && c == 0, r == l.pp - 1 && c == l.vp - 1,
              lt);
}

double AnalyticModel::ChunkLayerCount(const Layout& l, int r, int c) const {
  if (r < 0 || c < 0) return double(model_.layers) / (double(l.pp) * l.vp);
  return ChunkLayers(model_, l, r, c);
}

double AnalyticModel::ChunkMoeLayerCount(const Layout& l, int r, int c) const {
  if (!model_.moe()) return 0;
  if (r < 0 || c < 0) return double(model_.moe_layers()) / (double(l.pp) * l.vp);
  return ChunkMoeLayers(model_, l, r, c);
}

LayerCounts AnalyticModel::ChunkLayerCounts(const Layout& l, int r, int c) const {
  if (!model_.hybrid()) {  // dense and MoE transformer layers
    LayerCounts n;
    n[LayerKind::kMoe] = ChunkMoeLayerCount(l, r, c);
    n[LayerKind::kDense] = ChunkLayerCount(l, r, c) - n[LayerKind::kMoe];
    return n;
  }
  const std::vector<LayerCounts>& before = *kinds_before_;
  if (r < 0 || c < 0) return before.back().Scaled(1.0 / (double(l.pp) * l.vp));
  const int64_t first = std::clamp<int64_t>(ChunkFirstLayer(model_, l, r, c), 0, model_.layers);
  const int64_t last =
      std::clamp<int64_t>(first + ChunkLayers(model_, l, r, c), first, model_.layers);
  LayerCounts n;
  for (int k = 0; k < kLayerKinds; ++k)
    n.n[size_t(k)] = before[size_t(last)].n[size_t(k)] - before[size_t(first)].n[size_t(k)];
  return n;
}

LayerCounts AnalyticModel::RankLayerCounts(const Layout& l, int r) const {
  if (!model_.hybrid()) {
    LayerCounts n;
    n[LayerKind::kMoe] = RankMoeLayers(l, r);
    n[LayerKind::kDense] = double(RankLayers(model_, l, r)) - n[LayerKind::kMoe];
    return n;
  }
  LayerCounts n;
  for (int c = 0; c < l.vp; ++c) {
    const LayerCounts k = ChunkLayerCounts(l, r, c);
    for (int i = 0; i < kLayerKinds; ++i) n.n[size_t(i)] += k.n[size_t(i)];
  }
  return n;
}

double AnalyticModel::RankMoeLayers(const Layout& l, int r) const {
  return model_.moe() ? ::ptdp::RankMoeLayers(model_, l, r) : 0;
}

// Calls f(r, n) for the stages that stand for all of them, n the stages alike to r: without a
// layout string the first, the last and one middle stage (the middle ones hold the same layers;
// rank 1 keeps the most micro-batches in flight of them); with one, every stage.
template <typename F>
static void ForStageClasses(const Layout& l, F&& f) {
  const int p = l.pp;
  if (l.pipeline_layout) {
    for (int r = 0; r < p; ++r) f(r, 1.0);
    return;
  }
  f(0, 1.0);
  if (p > 1) f(p - 1, 1.0);
  if (p > 2) f(1, double(p - 2));
}

StageTimes AnalyticModel::Work(const Layout& l, LayerCounts layers, bool embedding, bool output,
                               const LayerTimes& lt) const {
  StageTimes st;
  // The last stage also runs the MTP modules: each depth's layers (a transformer's one layer
  // of its last layer's kind, a hybrid model's depth pattern) and their extra output pass.
  const double mtp = output ? double(model_.mtp_layers) : 0;
  if (mtp > 0) {
    const LayerCounts depth = model_.mtp_layer_counts();
    for (int k = 0; k < kLayerKinds; ++k) layers.n[size_t(k)] += mtp * depth.n[size_t(k)];
  }
  double fc = 0, bc = 0, ftp = 0, btp = 0;
  auto add = [&](double n, const OneLayerTimes& t) {
    fc += n * t.fwd_compute_s;
    bc += n * t.bwd_compute_s;
    ftp += n * t.fwd_tp_s;
    btp += n * t.bwd_tp_s;
  };
  // --cpu-offloading-num-layers: the offloaded layers' activations cross the host link in the
  // forward (device to host) and back in the backward, beside the layers' compute; what the
  // compute cannot cover waits (computed below, over the layers' times).
  double offload_s = 0;
  if (OffloadedLayers(l) > 0) {
    const double L = layers.total();
    offload_s = KindsActivationBytes(l, layers) * OffloadedLayers(l) / L /
                topo_->spec().gpu.host_bw_bytes_per_s;
  }
  if (model_.hybrid()) {
    // The GPU's and the host's time over the stage's layers, the larger of the two.
    double fg = 0, bg = 0, fh = 0, bh = 0;
    for (int k = 0; k < kLayerKinds; ++k) {
      const double n = layers.n[size_t(k)];
      const OneLayerTimes& t = lt.kinds[size_t(k)];
      if (n <= 0) continue;
      fg += n * t.fwd_gpu_s, bg += n * t.bwd_gpu_s, fh += n * t.fwd_host_s, bh += n * t.bwd_host_s;
      ftp += n * t.fwd_tp_s, btp += n * t.bwd_tp_s;
    }
    fc += std::max(fg, fh) - ftp;
    bc += std::max(bg, bh) - btp;
  } else {
    add(layers[LayerKind::kDense], {lt.fwd_compute_s, lt.bwd_compute_s, lt.recompute_s,
                                    lt.fwd_tp_s, lt.bwd_tp_s});
    add(layers[LayerKind::kMoe], lt.moe);
  }
  if (offload_s > 0) {
    fc += std::max(0.0, offload_s - fc);
    bc += std::max(0.0, offload_s - bc);
  }
  fc += mtp * lt.mtp.fwd_compute_s;
  bc += mtp * lt.mtp.bwd_compute_s;
  ftp += mtp * lt.mtp.fwd_tp_s;
  btp += mtp * lt.mtp.bwd_tp_s;
  // One call of the chunk per micro-batch each way (host), then its embedding (or the input
  // from the previous stage) and output ops.
  fc += k_.microbatch_overhead_s;
  bc += k_.microbatch_overhead_s;
  for (const PassTimes* p : {embedding ? &lt.embedding : &lt.input, output ? &lt.output : nullptr}) {
    if (!p) continue;
    fc += p->fwd_compute_s;
    ftp += p->fwd_tp_s;
    bc += p->bwd_compute_s;
    btp += p->bwd_tp_s;
  }
  st.fwd_s = fc + ftp;
  st.bwd_s = bc + btp;
  st.compute_s = fc + bc;
  st.tp_s = ftp + btp;
  st.fwd_tp_s = ftp;
  st.bwd_tp_s = btp;
  return st;
}

double AnalyticModel::P2pTime(const Layout& l) const {
  if (l.pp == 1) return 0;
  if (runtime_) return runtime_->P2p(l);
  const double T = double(l.micro_batch) * model_.seq_len / l.cp;
  const double full = T * model_.hidden * ActBytes(l.precision);
  // Scatter/gather optimisation (Narayanan sec. 4.1): each TP rank sends 1/t, then the
  // receivers all-gather over NVLink. With SP the tensor is already split along s.
  const double sent = l.tp > 1 ? full / l.tp : full;
  double time = Coll(Collective::kSendRecv, l.tp * l.cp * l.dp, 2, sent);
  if (l.tp > 1 && !l.sequence_parallel) time += Coll(Collective::kAllGather, 1, l.tp, full);
  return time;
}

// The weights of rank r's layers on one GPU of it: the non-expert ones (split over TP) and the
// routed experts (over ep x etp), each chunk's layers with their own kinds.
void AnalyticModel::RankLayerParams(const Layout& l, int r, double* dense, double* experts) const {
  const ModelSpec& M = model_;
  if (!M.moe() && !M.hybrid()) {
    *dense = double(RankLayers(M, l, r)) * layer_params_.dense_layer / l.tp;
    *experts = 0;
    return;
  }
  if (M.hybrid()) {  // each kind its weights; the E layers' routed experts over ep x etp
    const LayerCounts n = RankLayerCounts(l, r);
    double shared = 0;
    for (int k = 0; k < kLayerKinds; ++k) shared += n.n[size_t(k)] * layer_params_.kind[size_t(k)];
    *dense = (shared - n.moe() * layer_params_.routed) / l.tp +
             n.moe() * layer_params_.latent * (1 - 1.0 / l.tp);
    *experts = n.moe() * layer_params_.routed / (double(l.ep) * l.expert_tp());
    return;
  }
  // The layers of rank r depend on the split only: a small per-thread memo of (dense, MoE)
  // layer counts (Evaluate asks for each stage several times, the planner for the same splits
  // across tp, dp, ep and the knobs).
  struct Key {
    uint64_t model;
    uint64_t layout_string;  // PipelineLayout::serial (0: none)
    int pp, vp, r, first, last;
    bool emb, loss;
    bool operator==(const Key&) const = default;
  };
  struct Entry {
    Key key;
    double dense_layers, moe_layers;
  };
  static constexpr size_t kSlots = 1024;
  thread_local std::array<Entry, kSlots> memo{};
  const Key key{id_, l.pipeline_layout ? l.pipeline_layout->serial : 0, l.pp, l.vp, r,
                l.first_stage_layers,
                l.last_stage_layers, l.embedding_in_split, l.loss_in_split};
  uint64_t h = key.model * 0x9E3779B97F4A7C15ull ^ key.layout_string;
  for (uint64_t v : {uint64_t(l.pp), uint64_t(l.vp), uint64_t(r), uint64_t(key.first),
                     uint64_t(key.last) * 4 + key.emb * 2 + key.loss}) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  Entry& slot = memo[h % kSlots];
  // A layout string built by hand (serial 0) is never memoised.
  const bool unnamed = l.pipeline_layout && l.pipeline_layout->serial == 0;
  if (unnamed || !(slot.key == key)) {
    double n_all = 0, n_moe = 0;
    for (int c = 0; c < l.vp; ++c) {
      const int first = ChunkFirstLayer(M, l, r, c), n = ChunkLayers(M, l, r, c);
      n_all += n;
      n_moe += double(M.moe_layers_in(first, n));
    }
    slot = {key, n_all - n_moe, n_moe};
  }
  // LatentMoE's projections are replicated over TP (parallel_mode "duplicated").
  *dense = (slot.dense_layers * layer_params_.dense_layer +
            slot.moe_layers * layer_params_.moe_layer_shared) / l.tp +
           slot.moe_layers * layer_params_.latent * (1 - 1.0 / l.tp);
  *experts = slot.moe_layers * layer_params_.routed / (double(l.ep) * l.expert_tp());
}

double AnalyticModel::ParamsOnStage(const Layout& l, int r) const {
  const ModelSpec& M = model_;
  const double t = l.tp;
  double dense, experts;
  RankLayerParams(l, r, &dense, &experts);
  double p = dense + experts;
  const double vocab_rows = double(M.padded_vocab(l.tp)) * M.hidden / t;
  if (r == 0)
    p += vocab_rows + (M.position == PositionEmbedding::kLearned ? double(M.seq_len) * M.hidden : 0);
  if (r == l.pp - 1) {
    const double final_norm = M.norm == Norm::kLayerNorm ? 2.0 * M.hidden : M.hidden;
    p += final_norm;
    if (!M.tied_embeddings || l.pp > 1) p += vocab_rows;  // untied, or the tied copy on the last stage
    p += double(M.mtp_weight_copies()) * MtpParamsPerGpu(l);
  }
  return p;
}

double AnalyticModel::MtpParamsPerGpu(const Layout& l) const {
  const ModelSpec& M = model_;
  if (M.mtp_layers == 0) return 0;
  const double routed = double(M.mtp_routed_params());
  const double latent = M.mtp_layer_counts().moe() * double(M.latent_params());
  return (double(M.mtp_params()) - routed - latent) / l.tp + latent +
         routed / (double(l.ep) * l.expert_tp());
}

double AnalyticModel::ExpertParamsOnStage(const Layout& l, int r) const {
  const ModelSpec& M = model_;
  if (!M.moe()) return 0;
  double dense, experts;
  RankLayerParams(l, r, &dense, &experts);
  if (r == l.pp - 1 && M.mtp_layers > 0)
    experts += double(M.mtp_weight_copies()) * double(M.mtp_routed_params()) /
               (double(l.ep) * l.expert_tp());
  return experts;
}

// Bytes of one gradient. The DDP buffers are fp32 with --accumulate-allreduce-grads-in-fp32,
// else the parameters' dtype (core/distributed/param_and_grad_buffer.py: grad_dtype = fp32 if
// grad_reduce_in_fp32 else param.dtype; training.py passes accumulate_allreduce_grads_in_fp32).
// training/arguments.py turns it on for --bf16 unless --grad-reduce-in-bf16, and leaves it off
// for --fp16: an fp16 run's gradients are fp16 unless the flag is given. Megatron-FSDP keeps
// and reduces them in the parameters' dtype (--megatron-fsdp-main-grads-dtype auto: bf16 for a
// bf16 model; docs/user-guide/features/megatron_fsdp.md).
double AnalyticModel::GradBytes(const Layout& l) const {
  if (l.shard_gradients) return WeightBytes(l.precision);
  switch (l.precision) {
    case Precision::kFp32: return 4.0;
    case Precision::kFp16: return l.accumulate_grads_in_fp32 ? 4.0 : 2.0;
    // bf16 weights (fp8, fp4 too); --main-grads-dtype bf16 leaves fp32 accumulation off as
    // --grad-reduce-in-bf16 does (training/arguments.py).
    default:
      return l.grad_reduce_in_bf16 || l.optimizer_state.main_grads == StateDtype::kBf16 ? 2.0
                                                                                  : 4.0;
  }
}

double AnalyticModel::OptimizerStateBytes(const Layout& l) {
  const OptimizerState& o = l.optimizer_state;
  const double moments = StateDtypeBytes(o.exp_avg) + StateDtypeBytes(o.exp_avg_sq);
  if (l.precision == Precision::kFp32) return moments;  // the weights are the master copy
  double master = 4;
  if (o.precision_aware) {
    // --main-params-dtype fp16: TE keeps fp16 masters. fp32 masters of a bf16 model: TE's
    // FusedAdam stores the 16 bits bf16 lacks (store_param_remainders, on by default since TE
    // 2.1; distrib_optimizer.py allocates them as int16 when config.bf16). fp8 and fp4 keep
    // Megatron's own fp32 masters (use_precision_aware_optimizer_no_fp8_or_ds_fp8 is false for
    // the non-delayed recipes, optimizer_config.py).
    if (o.main_params == StateDtype::kFp16) master = 2;
    else if (l.precision == Precision::kBf16) master = 2;
  }
  return master + moments;
}

AnalyticModel::GradReduce AnalyticModel::GradReduceTimes(const Layout& l, int stride, int size,
                                                          double params) const {
  if (size <= 1 || params <= 0) return {};
  // The reduction after the last micro-batch (ZeRO-2's earlier ones: ChunkGradShardTime): the
  // distributed optimizer reduce-scatters the gradients and all-gathers the updated weights,
  // plain DDP all-reduces.
  if (l.distributed_optimizer)
    return {Coll(Collective::kReduceScatter, stride, size, params * GradBytes(l)),
            Coll(Collective::kAllGather, stride, size, params * WeightBytes(l.precision))};
  return {Coll(Collective::kAllReduce, stride, size, params * GradBytes(l)), 0};
}

double AnalyticModel::DpTime(const Layout& l, double params) const {
  // Gradients are reduced over DP x CP (Megatron), ranks tp apart.
  const GradReduce g = GradReduceTimes(l, l.tp, l.dp * l.cp, params);
  return g.reduce_s + g.gather_s;
}

double AnalyticModel::ExpertDpTime(const Layout& l, double params) const {
  // The expert-DP group: edp ranks etp x ep apart.
  const GradReduce g = GradReduceTimes(l, l.expert_tp() * l.ep, l.expert_dp(), params);
  return g.reduce_s + g.gather_s;
}

double AnalyticModel::ChunkGradShardTime(const Layout& l, int r, int c) const {
  const int n = l.dp * l.cp;
  if (!l.shard_gradients || n <= 1 || runtime_) return 0;
  const double params = ChunkParams(l, r, c);
  const double nb = ChunkDpBuckets(l, r, c);
  double t = nb * Coll(Collective::kReduceScatter, l.tp, n, params / nb * GradBytes(l));
  // ZeRO-3: each unit's weights gathered before its forward and again before its backward.
  if (l.shard_params)
    t += 2 * nb * Coll(Collective::kAllGather, l.tp, n, params / nb * WeightBytes(l.precision));
  return t;
}

// megatron/core/distributed/distributed_data_parallel.py: bucket_size defaults to
// max(40,000,000, 1,000,000 x the DP x CP group size) parameters with --overlap-grad-reduce
// (one bucket per model chunk without it).
double AnalyticModel::BucketParams(const Layout& l) const {
  return double(l.GradBucketParams());
}

double AnalyticModel::DpExposed(const Layout& l, double params, double bwd_s,
                                double fwd_s) const {
  return DpExposed(l, params, 0, bwd_s, fwd_s);
}

double AnalyticModel::DpExposed(const Layout& l, double params, double expert_params,
                                double bwd_s, double fwd_s) const {
  const int n = l.dp * l.cp, ne = expert_params > 0 ? l.expert_dp() : 1;
  const double dense = params - expert_params;
  if ((n <= 1 || dense <= 0) && (ne <= 1 || expert_params <= 0)) return 0;
  // ZeRO-2 overlaps its reduce-scatters whatever --overlap-grad-reduce says (Megatron-FSDP).
  if (!l.overlap_grad_reduce && !l.shard_gradients)
    return DpTime(l, dense) + ExpertDpTime(l, expert_params);
  // Buckets per chunk, at least one per model chunk; the experts' gradients have buckets of
  // their own (Megatron's expert-parallel buffers), reduced over expert DP on the same stream.
  const double nb_dense = n > 1 && dense > 0 ? std::max(double(l.vp), std::ceil(dense / BucketParams(l))) : 0;
  const double nb_exp = ne > 1 ? std::ceil(expert_params / BucketParams(l)) : 0;
  const double nb = nb_dense + nb_exp;
  double rs = 0, ag = 0;
  auto bucket = [&](double per, int stride, int size, double share) {
    const GradReduce g = GradReduceTimes(l, stride, size, per);
    rs += share * g.reduce_s;
    ag += share * g.gather_s;
  };
  // rs, ag: the mean time of one bucket over both kinds.
  if (nb_dense > 0) bucket(dense / nb_dense, l.tp, n, nb_dense / nb);
  if (nb_exp > 0) bucket(expert_params / nb_exp, l.expert_tp() * l.ep, ne, nb_exp / nb);
  // Bucket j of nb is ready at j/nb of the window and they run one after another on the DP
  // stream: the last finishes at max(W/nb + nb*tau, W + tau), i.e. exposed
  // max(nb*tau - W + W/nb, tau) after the window; the hidden rest costs overlap_interference.
  auto exposed = [&](double tau, double window) {
    if (tau <= 0) return 0.0;
    const double total = nb * tau;
    const double e = std::max(total - window + window / nb, tau);
    return e + k_.overlap_interference * std::max(0.0, total - e);
  };
  double rs_exposed = exposed(rs, bwd_s);
  if (l.shard_gradients && rs > 0) {
    // ZeRO-2 reduce-scatters after every micro-batch's backward; the DP stream works through
    // them under the forwards and backwards that follow (1F1B's steady state), so the m x nb
    // buckets share a window of (m - 1)(F + B) + B and what it cannot cover is left at the end.
    // ZeRO-3 adds, per micro-batch and unit, the weights' all-gather before the forward and
    // again before the backward (Megatron-FSDP prefetches the next unit's under the current
    // one): the same stream, a window of every forward and backward, and no all-gather after
    // the optimizer (the next forward gathers the updated shards).
    const double m = double(l.num_microbatches());
    const double per = rs + (l.shard_params ? 2 * ag : 0);
    const double total = m * nb * per,
                 window = (m - 1) * (fwd_s + bwd_s) + bwd_s + (l.shard_params ? fwd_s : 0);
    const double e = std::max(total - window + bwd_s / nb, per);
    rs_exposed = e + k_.overlap_interference * std::max(0.0, total - e);
    if (l.shard_params) return rs_exposed;
  }
  // --overlap-param-gather off: the updated parameters' all-gathers follow the optimizer step,
  // every bucket on the critical path.
  return rs_exposed + (l.overlap_param_gather ? exposed(ag, fwd_s) : nb * ag);
}

// Bytes one layer keeps for its backward per micro-batch, term by term as Megatron-Core with
// Transformer Engine saves them (Korthikanti et al. 2022 sec. 4.1 and table 2 count the same
// tensors for GPT: 34 s b h with t = 1): per token, 16-bit, in units of h bytes,
//   replicated over TP (split by SP): each norm's input and output, 2 + 2, twice (TE's
//     LayerNormLinear keeps the output for the weight gradient); a 1-byte dropout mask after
//     attention and after the MLP when the model trains with dropout;
//   split over TP: Q 2, K and V 4 k/a (GQA), the attention output 2 (flash attention keeps
//     Q, K, V and O; O is the projection's input too), the first MLP GEMM's output 2 Fi/h and
//     the activation's output 2 F/h (GeLU: 8 + 8 at f = 4h; SwiGLU: fc1's 2f and its product);
//   with unfused attention and no selective recompute: the s x s scores, 5 a s / h bytes per
//     token (softmax output 2, dropout mask 1, dropout output 2; 2 without dropout).
// GPT-3 (f = 4h, k = a, dropout): 8 + 2 = 10 replicated, 2 + 4 + 2 + 8 + 8 = 24 split: table 2's
// 10 + 24/t and, with SP, 34/t. Llama 3 405B (f = 3.25h, k/a = 1/16, no dropout): 8 + 23.75.
// MoE layers keep, instead of the dense MLP's tensors (megatron/core/transformer/moe/): per
// assignment a rank's experts compute (Tr of them, gathered over expert TP), the permuted
// input 2h (FC1's weight gradient), FC1's output 2 Fei and the activation's 2 Fe; the router's
// fp32 probabilities and its routing map, 5 E bytes per token (the routing weights multiply
// inside the experts' activation, weighted_bias_swiglu_impl, so the combine keeps nothing:
// Megatron-Core's memory-efficient permutation, 2659630721, core 0.13); the shared experts as a dense MLP
// of f_s. MLA keeps the two latents and their norms (4 (q_lora + kv_lora + qk_pos) bytes per
// token, replicated) and its q, k, v and output per head. Under fp8 and fp4 the GEMM inputs
// Transformer Engine quantizes for the weight gradient are kept quantized (LayerActivationBytes):
// GPT-3 at fp8 keeps 34 - 2 - 4 + 1 = 29 (the two norm outputs and FC2's input at 1 byte, the
// projection's quantized copy of the attention output beside flash attention's 16-bit one).
double AnalyticModel::LayerActivationBytes(const Layout& l, bool moe) const {
  return LayerActivationBytes(l, moe ? LayerKind::kMoe : LayerKind::kDense);
}

// A hybrid model's one-block layers keep their block's share: the norm input and residual
// bytes of one block (4 sbh, + sbh of dropout mask), and the attention's, the MLP's or the MoE
// block's terms as above; a Mamba layer its in_proj output (z, x, B, C, dt), the scan's
// output before the gated norm and out_proj's input (mamba_ssm's
// mamba_split_conv1d_scan_combined saves zxBCdt and out_x; the chunk states are recomputed
// in its backward), all split over TP (with CP each rank holds heads/(t c) of the whole
// sequence: as many).
double AnalyticModel::LayerActivationBytes(const Layout& l, LayerKind kind) const {
  if (runtime_) return runtime_->LayerActivationBytes(l, HasMoe(kind));
  const ModelSpec& M = model_;
  const double t = l.tp, b = l.micro_batch, s = M.seq_len, sl = s / l.cp, h = M.hidden,
               a = M.heads;
  const double sbh = sl * b * h;
  const double fp32 = l.precision == Precision::kFp32 ? 2 : 1;
  const bool sp = l.sequence_parallel && l.tp > 1;
  if (l.recompute == Recompute::kFull)  // only the layer input is kept
    return 2.0 * sbh / (sp ? t : 1) * fp32;
  const bool attn = HasAttention(kind), moe = HasMoe(kind) && M.moe();
  const bool dense_mlp = kind == LayerKind::kDense || kind == LayerKind::kMlp;
  const bool mamba = kind == LayerKind::kMamba;
  // Fused (flash) attention never stores the s x s scores, nor does selective recompute.
  const bool fused_attention = k_.softmax_bytes_per_score == 0;
  const bool sel = l.recompute == Recompute::kSelective;
  const double score_term =
      (!attn || fused_attention || sel) ? 0 : (M.dropout ? 5.0 : 2.0) * a * s / h;
  // --recompute-modules (selective): what the backward reruns is not kept (layernorm: each
  // block's norm output, 2 sbh; mlp: the dense MLP's inside; moe: the MoE block's; moe_act: the
  // experts' activation output; shared_experts: theirs; mla_up_proj: MLA's q, k and v).
  const uint8_t rm = l.RecomputedModules();
  // Under fp8 (and NVFP4) Transformer Engine keeps a linear layer's input for its weight
  // gradient quantized, q bytes an element (1; NVFP4 4 bits and a byte per 16): the norm
  // outputs QKV, FC1 and Mamba's in_proj read (LayerNormLinear, LayerNormMLP), FC2's input,
  // out_proj's input, the experts' inputs. What another op keeps in 16 bits stays so: the MoE
  // norm's output (the router reads it; the latent and shared-expert GEMMs keep quantized
  // copies), the activations' inputs, and the attention output, which flash attention keeps
  // beside the projection's quantized copy.
  const bool low = l.precision == Precision::kFp8 || l.precision == Precision::kFp4;
  const double q = l.precision == Precision::kFp4 ? 0.5625 : low ? 1.0 : 2.0;
  // Per block: its input (2), a dropout mask (1), its norm's output (q; 2 for the MoE block's).
  auto block = [&](bool norm_read_in_16_bits) {
    return 2.0 + (M.dropout ? 1.0 : 0.0) +
           ((rm & kRecomputeLayernorm) ? 0.0 : norm_read_in_16_bits ? 2.0 : q);
  };
  double replicated = (attn ? block(false) : 0) + (dense_mlp ? block(false) : 0) +
                      (moe ? block(true) : 0) + (mamba ? block(false) : 0);
  // Q, K, V and the output, in units of h (GPT: 2 + 4 k/a + 2).
  double attention = 0;
  if (attn && M.mla()) {
    const double qk = double(M.qk_head_dim + M.qk_pos_head_dim), v = double(M.v_head_dim);
    attention = (rm & kRecomputeMlaUpProj) ? 2.0 * a * v / h : 2.0 * a * (2 * qk + 2 * v) / h;
    replicated += 4.0 * double(M.q_lora_rank + M.kv_lora_rank + M.qk_pos_head_dim) / h;
    if (low) attention += q * a * v / h;
  } else if (attn) {
    const double hd = double(M.head_dim());
    attention = 2.0 * (2 * a * hd + 2 * double(M.kv_heads) * hd) / h;
    if (low) attention += q * a * hd / h;
  }
  const double f = double(M.ffn_hidden) / h;
  const double fc1_out = M.gated() ? 2 * f : f;
  const double mlp = dense_mlp && !(rm & kRecomputeMlp) ? 2.0 * fc1_out + q * f : 0;
  const double ssm =
      mamba ? (2.0 * double(M.mamba_in_proj() + M.mamba_inner()) + q * double(M.mamba_inner())) / h
            : 0;
  const double split = attention + mlp + ssm;
  double bytes = sp ? sbh / t * (replicated + split + score_term)
                    : sbh * (replicated + (split + score_term) / t);
  if (moe && !(rm & kRecomputeMoe)) {
    const double T = sl * b, Tl = sp ? T / t : T, load = ExpertLoad(l), etp = l.expert_tp();
    const double k = double(M.moe_topk), E = double(M.num_experts);
    const double Fe = double(M.moe_ffn_hidden) / etp, Fei = M.gated() ? 2 * Fe : Fe;
    const double Tr = Tl * k * load * (sp ? etp : 1);
    // The routed tokens at the dispatch width (LatentMoE: L, and fc2_latent_proj's input).
    const double hm = double(M.moe_width()), lat = double(M.moe_latent_size);
    bytes += Tr * (q * hm + 2 * Fei + ((rm & kRecomputeMoeAct) ? 0 : q * Fe)) +
             Tl * E * 5 + Tl * q * lat;
    if (low && lat > 0) bytes += Tl * q * h;  // fc1_latent_proj's quantized input
    const double fs = double(M.moe_shared_ffn_hidden);
    if (fs > 0 && !(rm & kRecomputeSharedExperts))
      bytes += T * (2 * (M.gated() ? 2 * fs : fs) + q * fs) / t + (low ? Tl * q * h : 0);
  }
  return bytes * fp32;  // table 2 is for 16-bit
}

double AnalyticModel::KindsActivationBytes(const Layout& l, const LayerCounts& n) const {
  double bytes = 0;
  for (int k = 0; k < kLayerKinds; ++k)
    if (n.n[size_t(k)] > 0) bytes += n.n[size_t(k)] * LayerActivationBytes(l, LayerKind(k));
  return bytes;
}

// Activation bytes held on stage r at its peak: per-layer bytes times the layers of the
// micro-batches in flight (megatron-reference.md section 3), plus embedding and logits.
double AnalyticModel::Activations(const Layout& l, int r) const {
  const ModelSpec& M = model_;
  const double t = l.tp, sbh = double(M.seq_len) / l.cp * l.micro_batch * M.hidden;
  const LayerCounts counts = RankLayerCounts(l, r);
  const double moe_layers = counts.moe();
  // What each of the rank's chunks keeps per micro-batch: its layers, each kind its bytes; the
  // embedding's on chunk 0 of rank 0, MTP's layers on the last chunk of the last rank.
  // (Each kind's bytes once: the planner's hot path.)
  std::array<double, kLayerKinds> per_layer{};
  for (int k = 0; k < kLayerKinds; ++k)
    if (counts.n[size_t(k)] > 0) per_layer[size_t(k)] = LayerActivationBytes(l, LayerKind(k));
  auto layers_bytes = [&](const LayerCounts& n) {
    double b = 0;
    for (int k = 0; k < kLayerKinds; ++k) b += n.n[size_t(k)] * per_layer[size_t(k)];
    return b;
  };
  std::vector<double> kept(size_t(l.vp), layers_bytes(counts) / l.vp);
  // (Chunks alike unless the split, the layer count or a mix of kinds on the rank says not.)
  const bool mixed = M.hybrid() || (counts.moe() > 0 && counts.moe() < counts.total());
  if (l.vp > 1 && (l.pipeline_layout || l.embedding_in_split || l.loss_in_split ||
                   RankLayers(M, l, r) % l.vp != 0 || mixed))
    for (int c = 0; c < l.vp; ++c) kept[size_t(c)] = layers_bytes(ChunkLayerCounts(l, r, c));
  const double embedding = r == 0 ? sbh * 3.0 / (l.sequence_parallel ? t : 1) : 0;
  const double mtp = double(M.mtp_layers);
  const double mtp_layers =
      r == l.pp - 1 && mtp > 0 ? mtp * KindsActivationBytes(l, M.mtp_layer_counts()) : 0;
  kept.back() += mtp_layers;
  // At the schedule's peak (core/schedule.h: the warm-up's forwards and, where the chunks
  // differ, the steady state's; one more with --overlap-moe-expert-parallel-comm), and the
  // embedding's of the micro-batches whose chunk 0 the warm-up holds (small beside a layer's;
  // apart, so that rank 0's chunks stay alike where their layers are).
  const int64_t m = l.num_microbatches();
  double bytes = PeakInFlight(l.schedule, l.pp, l.vp, m, l.group_size(), r, l.moe_a2a_overlap,
                              kept);
  if (embedding > 0) {
    std::vector<double> on_chunk0(size_t(l.vp), 0.0);
    on_chunk0.front() = embedding;
    bytes += HeldAfterWarmup(l.schedule, l.pp, l.vp, m, l.group_size(), r, l.moe_a2a_overlap,
                             on_chunk0);
  }
  // --cpu-offloading-num-layers N (pp 1: one micro-batch in flight): each offloaded layer's
  // copy finishes by layer L - N + i of the forward and its reload starts at layer
  // L - 1 - N + i of the backward, so L - N layers' activations are on the GPU at the peak.
  if (OffloadedLayers(l) > 0)
    bytes = layers_bytes(counts) * (1 - OffloadedShare(l, counts)) + embedding + mtp_layers;
  if (l.recompute == Recompute::kFull) {  // one layer's full activations while recomputing
    Layout none = l;
    none.recompute = Recompute::kNone;
    double most = LayerActivationBytes(none, moe_layers > 0);
    if (M.hybrid()) {  // the rank's largest layer
      most = 0;
      for (int k = 0; k < kLayerKinds; ++k)
        if (counts.n[size_t(k)] > 0) most = std::max(most, LayerActivationBytes(none, LayerKind(k)));
    }
    bytes += most;
  }
  // Output layer and loss (megatron-reference.md section 7), + MTP's: one micro-batch's; the
  // logits' 4 bytes are the fp32 exp(logits) Megatron's own cross entropy keeps, 2 the
  // gradient Transformer Engine's writes over the 16-bit logits (CrossEntropyFusion).
  const double logit_bytes = l.cross_entropy == CrossEntropyFusion::kTe ? 2.0 : 4.0;
  if (r == l.pp - 1)
    bytes += (1 + mtp) * sbh / M.hidden *
             (4.0 * M.hidden + logit_bytes * double(M.padded_vocab(l.tp))) / t;
  return bytes;
}

MemoryBytes AnalyticModel::StageMemory(const Layout& l, int r) const {
  if (runtime_) {
    MemoryBytes mem = runtime_->StageMemory(l, r, k_.workspace_bytes, k_.fragmentation,
                                            topo_->spec().gpu.memory_bytes);
    mem.usable = mem.capacity * (1 - headroom_);
    return mem;
  }
  const double params = ParamsOnStage(l, r);
  const double experts = ExpertParamsOnStage(l, r);
  const double shard = l.distributed_optimizer ? double(l.dp) * l.cp : 1.0;
  // The experts' optimizer state is sharded over expert DP (Megatron's distributed optimizer
  // keeps a buffer per expert-parallel group).
  const double expert_shard =
      l.distributed_optimizer ? double(std::max(1, l.expert_dp())) : 1.0;
  MemoryBytes mem;
  mem.weights = params * WeightBytes(l.precision);
  mem.grads = params * GradBytes(l);
  if (l.shard_gradients && l.distributed_optimizer) {
    // Megatron-FSDP optim_grads: the gradients (GradBytes) sharded over dp x cp, plus the
    // unsharded gradients of the two FSDP units (layers) in flight (its double buffer);
    // optim_grads_params the weights the same way (two units gathered at a time).
    const double unit = double(model_.params_per_layer()) / l.tp;
    const double sharded = (params - experts) / shard + experts / expert_shard + 2.0 * unit;
    mem.grads = sharded * GradBytes(l);
    if (l.shard_params) mem.weights = sharded * WeightBytes(l.precision);
  }
  // fp32 master copy (none when training in fp32) + Adam m and v, or their lower-precision
  // --use-precision-aware-optimizer dtypes.
  mem.optimizer = ((params - experts) / shard + experts / expert_shard) * OptimizerStateBytes(l);
  mem.activations = Activations(l, r);
  if (OffloadedLayers(l) > 0) {  // what waits in host memory at the forward's end (pp 1)
    const LayerCounts counts = RankLayerCounts(l, r);
    mem.host = KindsActivationBytes(l, counts) / l.vp * OffloadedShare(l, counts);
  }
  const double sum = mem.weights + mem.grads + mem.optimizer + mem.activations;
  mem.other = k_.workspace_bytes + k_.fragmentation * sum;
  mem.total = sum + mem.other;
  mem.capacity = topo_->spec().gpu.memory_bytes;
  mem.usable = mem.capacity * (1 - headroom_);
  mem.host_usable = topo_->spec().gpu.host_memory_bytes * (1 - headroom_);
  return mem;
}

namespace {
// Forward FLOPs per token of a layer of kind k: 2 x the linear weights a token meets plus its
// attention scores, 2 s a (d_qk + d_v) (4 s h for GPT shapes; full, not causal-halved, as
// Korthikanti counts); a Mamba layer's scan as Megatron counts it, 7 d_inner N
// (megatron/training/training.py mamba_layer_flops).
double LayerFwdFlops(const ModelSpec& M, LayerKind k) {
  const double qk = M.mla() ? double(M.qk_head_dim + M.qk_pos_head_dim) : double(M.head_dim());
  const double v = M.mla() ? double(M.v_head_dim) : double(M.head_dim());
  const double attention =
      HasAttention(k) ? 2.0 * double(M.seq_len) * double(M.heads) * (qk + v) : 0;
  const double scan =
      k == LayerKind::kMamba ? 7.0 * double(M.mamba_inner()) * double(M.mamba_state_dim) : 0;
  return 2.0 * double(M.kind_active_linear_params(k)) + attention + scan;
}
// All layers' forward FLOPs per token (MTP modules with their layer, projection and logits).
double ModelFwdFlopsPerToken(const ModelSpec& M) {
  auto layers_f = [&M](const LayerCounts& n) {
    double f = 0;
    for (int k = 0; k < kLayerKinds; ++k)
      if (n.n[size_t(k)] > 0) f += n.n[size_t(k)] * LayerFwdFlops(M, LayerKind(k));
    return f;
  };
  double f = 2.0 * M.hidden * M.vocab + layers_f(M.layer_counts(0, M.layers));
  if (M.mtp_layers > 0)
    f += double(M.mtp_layers) * (layers_f(M.mtp_layer_counts()) + 4.0 * M.hidden * M.hidden +
                                 2.0 * M.hidden * M.vocab);
  return f;
}
}  // namespace

double AnalyticModel::ModelFlops(const Layout& l) const {
  // Per token: 3 x (2 x linear weights + 4 s h attention) per layer + 3 x 2 h V logits; equals
  // Korthikanti's 72 B L s h^2 (1 + s/(6h) + V/(12 h L)) for GPT shapes. MoE layers count the
  // k routed experts, the shared ones and the router (the weights a token meets).
  const ModelSpec& M = model_;
  const double tokens = double(l.global_batch) * M.seq_len;
  return 3.0 * tokens * fwd_flops_per_token_;
}

double AnalyticModel::HardwareFlops(const Layout& l) const {
  const ModelSpec& M = model_;
  const double tokens = double(l.global_batch) * M.seq_len;
  double extra = 0;
  if (l.recompute == Recompute::kFull)  // Narayanan eq. 3: the forward once more
    extra = tokens * (fwd_flops_per_token_ - 2.0 * M.hidden * M.vocab);
  const uint8_t rm = l.RecomputedModules();
  if (rm & kRecomputeCoreAttn)  // Korthikanti: s/(3h) instead of s/(6h)
    extra = tokens * attention_layers_ * 12.0 * M.seq_len * M.hidden;
  // The other modules' GEMMs once more (2 x the weights a token meets in them).
  if (rm & kRecomputeMlp) extra += tokens * dense_mlp_layers_ * 2.0 * double(M.dense_mlp_linear_params());
  if (rm & kRecomputeMoe) {
    extra += tokens * moe_layers_ * 2.0 * double(M.moe_mlp_active_linear_params());
  } else if (rm & kRecomputeSharedExperts) {
    extra += tokens * moe_layers_ * 2.0 * (M.gated() ? 3.0 : 2.0) * M.hidden * M.moe_shared_ffn_hidden;
  }
  if ((rm & kRecomputeMlaUpProj) && M.mla()) {
    const double q_in = M.q_lora_rank > 0 ? double(M.q_lora_rank) : double(M.hidden);
    const double up = q_in * M.heads * double(M.qk_head_dim + M.qk_pos_head_dim) +
                      double(M.kv_lora_rank) * M.heads * double(M.qk_head_dim + M.v_head_dim);
    extra += tokens * attention_layers_ * 2.0 * up;
  }
  return ModelFlops(l) + extra;
}

Estimate AnalyticModel::Evaluate(const Layout& layout) const {
  const Layout l = Executed(layout);
  Estimate e;
  const int p = l.pp;
  const double m = double(l.num_microbatches());
  // The stages: the slowest sets the steady state, the others the fill and drain.
  const LayerTimes lt = Layer(l);
  StageTimes slow;
  double sum_stages = 0, params = 0, expert_params = 0, opt = 0;
  ForStageClasses(l, [&](int r, double n) {
    const StageTimes st = StageFrom(l, r, lt);
    if (st.total() > slow.total()) slow = st;
    sum_stages += n * st.total();
    const double pr = ParamsOnStage(l, r);
    if (pr > params) params = pr, expert_params = ExpertParamsOnStage(l, r);
    opt = std::max(opt, StageOptimizerTime(l, r));
  });
  Breakdown& br = e.breakdown;
  br.compute_s = m * slow.compute_s;
  br.tp_comm_s = m * slow.tp_s;
  // Fill and drain: every other stage's work once, shortened v times by interleaving
  // (Narayanan sec. 2.2: bubble (p-1)/(v m) of the ideal time for uniform stages).
  br.bubble_s = (sum_stages - slow.total()) / l.vp;
  // Blocking p2p on the critical path: a send per chunk boundary each way for every micro-batch,
  // plus the fill and drain hops.
  // With --overlap-p2p-communication (interleaved) as without: the H100 recipes, all run with
  // it, fit best with every transfer on the critical path (docs/cost-model.md: a law that hid
  // the steady-state transfers under the next chunk took the H100 mean from 3.4% to 4.5% and
  // the max to 20%, 17.6% refitted); the flag changes which layouts are legal.
  br.pp_comm_s = p > 1 ? k_.pp_exposed * 2.0 * (m * l.vp + p - 1) * P2pTime(l) : 0;

  // DP: the stage with the most parameters finishes last.
  double dp = 0;
  if (runtime_) {
    // The runtime's buckets of the stage with the most to reduce; with --overlap-grad-reduce
    // those handed over during the last backward hidden under it as DpExposed's law has it
    // (max(total - W (1 - 1/nb), total/nb)); one bucket hides nothing.
    for (int r : {0, 1 % p, p - 1}) {
      double stage = 0;
      int nb = 0;
      for (int c = 0; c < l.vp; ++c) {
        stage += runtime_->ChunkDp(l, r, c);
        nb += ChunkDpBuckets(l, r, c);
      }
      if (l.overlap_grad_reduce) stage = ExposedBeside(stage, nb, slow.bwd_s);
      dp = std::max(dp, stage + StageDpGatherTime(l, r, slow.fwd_s));
    }
  } else {
    dp = DpExposed(l, params, expert_params, slow.bwd_s, slow.fwd_s);
  }
  br.dp_comm_s = dp + EmbeddingReduceTime(l);
  br.optimizer_s = opt;

  e.step_time_s = br.total();
  e.bubble_fraction = br.bubble_s / e.step_time_s;
  e.model_flops = ModelFlops(l);
  e.hw_flops = HardwareFlops(l);
  e.mfu = e.model_flops / (e.step_time_s * l.world() * MfuPeak(l.precision));
  // Memory: the first stage keeps the most micro-batches in flight, the last holds the logits,
  // and with an uneven split a middle stage may hold more layers than either.
  ForStageClasses(l, [&](int r, double) {
    const MemoryBytes mem = StageMemory(l, r);
    if (mem.total > e.memory.total) e.memory = mem;
  });
  e.fits = e.memory.fits();
  return e;
}

double AnalyticModel::EmbeddingReduceTime(const Layout& l) const {
  if (runtime_) return runtime_->EmbeddingReduce(l);
  // Tied embedding gradient between first and last stage (the embedding group).
  if (!model_.tied_embeddings || l.pp == 1) return 0;
  // finalize_model_grads' _allreduce_word_embedding_grads reduces the main grads (GradBytes).
  const double emb = double(model_.padded_vocab(l.tp)) * model_.hidden / l.tp * GradBytes(l);
  return Coll(Collective::kAllReduce, l.tp * l.cp * l.dp * (l.pp - 1), 2, emb);
}

double AnalyticModel::OptimizerTime(const Layout& l, double params, double expert_params) const {
  const double hbm = topo_->spec().gpu.hbm_bw_bytes_per_s * k_.hbm_eff;
  const double shard = l.distributed_optimizer ? double(l.dp) * l.cp : 1.0;
  const double expert_shard =
      l.distributed_optimizer ? double(std::max(1, l.expert_dp())) : 1.0;
  const double updated = (params - expert_params) / shard + expert_params / expert_shard;
  // The update streams the state: smaller dtypes read and write fewer bytes, in proportion.
  Layout plain = l;
  plain.optimizer_state = {};
  const double state = OptimizerStateBytes(l) / OptimizerStateBytes(plain);
  return updated * k_.optimizer_bytes_per_param * state / hbm +
         params * 4.0 / hbm +  // gradient norm reads every local gradient
         k_.step_overhead_s;
}

double AnalyticModel::StageOptimizerTime(const Layout& l, int r) const {
  if (runtime_) return runtime_->Optimizer(l, r).total_s;
  return OptimizerTime(l, ParamsOnStage(l, r), ExpertParamsOnStage(l, r));
}

double AnalyticModel::StaticMemory(const Layout& l, int r) const {
  const MemoryBytes m = StageMemory(l, r);
  return m.total - m.activations * (1 + k_.fragmentation);
}

double AnalyticModel::ChunkActivationBytes(const Layout& l, int r, int c) const {
  return KindsActivationBytes(l, ChunkLayerCounts(l, r, c)) * (1 + k_.fragmentation);
}

double AnalyticModel::ChunkParams(const Layout& l, int r, int c) const {
  // The stage's parameters split over its chunks; the embedding/output rows go with the chunk
  // that holds them.
  const ModelSpec& M = model_;
  auto layers = [&](int cc) {
    const int first = ChunkFirstLayer(M, l, r, cc), n = ChunkLayers(M, l, r, cc);
    const double routed = double(M.routed_params(first, n));
    return (double(M.layer_params(first, n)) - routed) / l.tp +
           routed / (double(l.ep) * l.expert_tp());
  };
  double in_layers = 0;
  for (int cc = 0; cc < l.vp; ++cc) in_layers += layers(cc);
  const double extra = ParamsOnStage(l, r) - in_layers;
  double params = layers(c);
  if ((r == 0 && c == 0) || (r == l.pp - 1 && c == l.vp - 1)) params += extra;
  return params;
}

double AnalyticModel::ChunkDpTime(const Layout& l, int r, int c) const {
  if (runtime_) return runtime_->ChunkDp(l, r, c);
  const double params = ChunkParams(l, r, c);
  // The chunk's routed experts are reduced over expert DP, the rest over dp x cp.
  const double experts =
      model_.moe() ? double(model_.routed_params(ChunkFirstLayer(model_, l, r, c),
                                                 ChunkLayers(model_, l, r, c))) /
                         (double(l.ep) * l.expert_tp())
                   : 0;
  const int n = l.dp * l.cp;
  if (n <= 1 || !l.overlap_grad_reduce)
    return DpTime(l, params - experts) + ExpertDpTime(l, experts);
  // As buckets (DpExposed): one collective per bucket.
  const double nb = ChunkDpBuckets(l, r, c);
  return nb * (DpTime(l, (params - experts) / nb) + ExpertDpTime(l, experts / nb));
}

// The gathers run one after another from the step's end; part j of n of the forward reads its
// parameters at about j/n of the window, so the last is ready max(total/n, total - W (1 - 1/n))
// after the forward began (DpExposed's law).
double AnalyticModel::StageDpGatherTime(const Layout& l, int r, double fwd_s) const {
  if (!runtime_) return 0;
  double total = 0;
  int parts = 0;
  for (int c = 0; c < l.vp; ++c) {
    total += runtime_->ChunkDpGather(l, r, c);
    parts += runtime_->ChunkDpGatherParts(l, r, c);
  }
  return l.param_gather_overlapped() ? ExposedBeside(total, parts, fwd_s) : total;
}

int AnalyticModel::ChunkDpBuckets(const Layout& l, int r, int c) const {
  if (!l.overlap_grad_reduce) return 1;
  if (runtime_) {  // the ones handed over during the backward
    int n = 0;
    for (const RuntimeModel::DpBucket& b : runtime_->ChunkDpBuckets(l, r, c)) n += b.overlapped;
    return std::max(1, n);
  }
  return std::max(1, int(std::ceil(ChunkParams(l, r, c) / BucketParams(l))));
}

double AnalyticModel::LowerBound(const Layout& layout) const {
  const Layout l = Executed(layout);
  const LayerTimes lt = Layer(l);
  double compute = 0, opt = 0;
  for (int r = 0; r < l.pp; ++r) {
    compute = std::max(compute, StageFrom(l, r, lt).compute_s);
    opt = std::max(opt, StageOptimizerTime(l, r));
  }
  return double(l.num_microbatches()) * compute + opt;
}

Prediction AnalyticModel::Predict(const Layout& l) const {
  const Estimate e = Evaluate(l);
  Prediction p;
  p.step_time_s = e.step_time_s;
  p.tflops_per_gpu = e.model_flops / e.step_time_s / l.world() / 1e12;
  p.hw_tflops_per_gpu = e.hw_flops / e.step_time_s / l.world() / 1e12;
  p.mfu = e.mfu;
  p.bubble_fraction = e.bubble_fraction;
  p.breakdown = e.breakdown;
  p.memory = e.memory;
  p.fits = e.fits;
  p.source = "analytic";
  const Layout x = Executed(l);
  for (int r = 0; r < l.pp; ++r) {
    const MemoryBytes mem = StageMemory(x, r);
    p.stage_memory_bytes.push_back(mem.total);
    if (mem.total > p.memory.total) p.memory = mem;
  }
  p.fits = p.memory.fits();
  return p;
}

}  // namespace ptdp
