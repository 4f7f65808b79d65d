// Predicted against measured; see compare.h.
#include "cli/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "cli/speed_probe.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "core/rank_grid.h"

namespace ptdp::cli {

const char* ComponentName(int c) {
  static const char* const kNames[] = {"compute", "tp_comm", "pp_bubble", "dp_comm", "optimizer", "idle"};
  return c >= 0 && c < kNumComponents ? kNames[c] : "?";
}

double ErrorPct(double predicted, double measured) {
  if (measured == 0)
    return predicted == 0 ? 0 : std::copysign(std::numeric_limits<double>::infinity(), predicted);
  return 100 * (predicted - measured) / measured;
}

namespace {

Parts Mean(const std::vector<RankComparison>& ranks, bool predicted) {
  Parts p{};
  for (const RankComparison& r : ranks)
    for (int c = 0; c < kNumComponents; ++c) p[c] += (predicted ? r.predicted : r.measured)[c];
  for (double& v : p) v /= std::max<size_t>(1, ranks.size());
  return p;
}

using json = nlohmann::json;

// A number of measured.json inside its range (core/limits.h): a negative, huge or (from a
// hand-edited file) out-of-range time is refused rather than compared.
double Num(const json& j, const char* key, const std::string& where, const Range& range) {
  if (!j.contains(key) || !j[key].is_number())
    throw std::runtime_error(where + ": missing number '" + key + "'");
  const double v = j[key].get<double>();
  if (Status st = CheckRange(v, range); !st.ok())
    throw std::runtime_error(where + ": " + key + ": " + st.message());
  return v;
}

// Fails when the measured layout is not the plan's (a comparison of different things).
Status SameLayout(const Layout& l, const json& m, const std::string& file) {
  const std::string got = "tp" + std::to_string(m.value("tp", 0)) + " pp" +
                          std::to_string(m.value("pp", 0)) + " dp" + std::to_string(m.value("dp", 0)) +
                          " vp" + std::to_string(m.value("vp", 0)) + " mb" +
                          std::to_string(m.value("micro_batch", 0)) + " B" +
                          std::to_string(m.value("global_batch", int64_t(0)));
  const bool same = m.value("tp", 0) == l.tp && m.value("pp", 0) == l.pp &&
                    m.value("dp", 0) == l.dp && m.value("vp", 0) == l.vp &&
                    m.value("cp", 1) == l.cp && m.value("micro_batch", 0) == l.micro_batch &&
                    m.value("global_batch", int64_t(0)) == l.global_batch &&
                    m.value("sequence_parallel", false) == l.sequence_parallel &&
                    m.value("distributed_optimizer", false) == l.distributed_optimizer &&
                    m.value("schedule", std::string()) == ToString(l.schedule);
  if (same) return Status::Ok();
  return Status::Error(file + ": measured layout " + got + " (" + DumpJson(m, -1) +
                       ") is not the plan's " + l.ShortName() + " [" + l.Knobs() + "], " +
                       ToString(l.schedule) + ", B " + std::to_string(l.global_batch));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The measured side: per-rank parts (medians of `timing`, else the means of `ranks`), the step
// time (median of the timed steps) and the timeline.
void ReadMeasured(const json& j, const std::string& file, Comparison* c) {
  c->backend = j.contains("machine") ? j["machine"].value("backend", std::string("?")) : "?";
  c->host = j.contains("machine") ? j["machine"].value("hostname", std::string("?")) : "?";
  c->machine_cores = j.contains("machine") && j["machine"].contains("cores")
                          ? int(Num(j["machine"], "cores", file + ": machine", limits::kMachineCores))
                          : 0;
  const bool timing = j.contains("timing") && j["timing"].is_object();
  const json& ranks = timing ? j["timing"]["ranks"] : j.at("ranks");
  if (!ranks.is_array() || ranks.empty()) throw std::runtime_error(file + ": no ranks");
  if (timing) {
    const json& t = j["timing"];
    c->measured_step_s = Num(t, "step_time_median_s", file + ": timing", limits::kRunStepTime);
    c->measured_step_min_s = Num(t, "step_time_min_s", file + ": timing", limits::kRunStepTime);
    c->measured_step_max_s = Num(t, "step_time_max_s", file + ": timing", limits::kRunStepTime);
    c->warmup_steps = int(Num(t, "warmup_steps", file + ": timing", limits::kRunSteps));
    c->timed_steps = int(Num(t, "timed_steps", file + ": timing", limits::kRunSteps));
    if (t.contains("other_cpu_share") && t["other_cpu_share"].is_number())
      c->other_cpu_share = Num(t, "other_cpu_share", file + ": timing", limits::kCpuShare);
  } else {  // an older measured.json: the median of the steps after the first
    const json& steps = j.at("steps");
    std::vector<double> v;
    for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i)
      v.push_back(Num(steps[i], "step_time_s", file + ": steps", limits::kRunStepTime));
    if (v.empty()) throw std::runtime_error(file + ": no steps");
    c->measured_step_s = Median(v);
    c->measured_step_min_s = *std::min_element(v.begin(), v.end());
    c->measured_step_max_s = *std::max_element(v.begin(), v.end());
    c->warmup_steps = steps.size() > 1 ? 1 : 0;
    c->timed_steps = int(v.size());
  }
  if (ranks.size() != c->ranks.size())
    throw std::runtime_error(file + ": " + std::to_string(ranks.size()) + " ranks, the plan has " +
                             std::to_string(c->ranks.size()));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const json& x = ranks[r];
    const std::string at = file + ": rank " + std::to_string(r);
    Parts& m = c->ranks[r].measured;
    m[kCompute] = Num(x, "forward_s", at, limits::kRunSeconds) + Num(x, "backward_s", at, limits::kRunSeconds);
    m[kTpComm] = Num(x, "tp_comm_s", at, limits::kRunSeconds);
    m[kPpBubble] = Num(x, "pp_wait_s", at, limits::kRunSeconds);
    m[kDpComm] = Num(x, "dp_comm_s", at, limits::kRunSeconds);
    m[kOptimizer] = Num(x, "optimizer_s", at, limits::kRunSeconds);
    m[kIdle] = Num(x, "idle_s", at, limits::kRunSeconds);
    c->ranks[r].measured_memory_bytes = Num(x, "peak_memory_bytes", at, limits::kRunBytes);
    if (x.contains("expert_load"))  // MoE runs (older files lack it)
      c->measured_expert_load = std::max(c->measured_expert_load,
                                         Num(x, "expert_load", at, limits::kRunExpertLoad));
  }
  if (j.contains("timeline") && j["timeline"].is_object()) {
    const json& t = j["timeline"];
    c->timeline_step_s = Num(t, "step_time_s", file + ": timeline", limits::kRunStepTime);
    c->timeline.assign(c->ranks.size(), {});
    for (const json& r : t.at("ranks")) {
      const size_t rank = r.at("rank").get<size_t>();
      if (rank >= c->timeline.size()) throw std::runtime_error(file + ": timeline rank out of range");
      for (const json& e : r.at("events"))
        c->timeline[rank].push_back({e.at("kind").get<std::string>(), e.value("microbatch", -1),
                                     e.value("chunk", -1), Num(e, "start_s", file + ": timeline", limits::kRunSeconds),
                                     Num(e, "end_s", file + ": timeline", limits::kRunSeconds)});
    }
  }
}

// The predicted side of every rank, from the simulation of its pipeline rank.
void FillPredicted(const World& w, const Layout& l, Comparison* c) {
  const Layout x = w.cost->Executed(l);
  for (RankComparison& rc : c->ranks) {
    const SimRankStats& s = c->sim.ranks[size_t(rc.stage)];
    RuntimeOptimizerTimes opt;  // zero parts without a runtime model
    if (w.cost->runtime()) opt = w.cost->runtime()->Optimizer(x, rc.stage);
    Parts& p = rc.predicted;
    // --grad-reduce-in-bf16's rounding runs inside the backwards (measured as compute).
    p[kCompute] = s.compute_s - s.tp_s + opt.round_s;
    p[kTpComm] = s.tp_s + opt.tp_s;
    p[kPpBubble] = s.p2p_blocked_s;
    p[kDpComm] = s.dp_s + opt.dp_s;
    p[kOptimizer] = s.optimizer_s - opt.tp_s - opt.dp_s - opt.fill_s - opt.round_s;
    double busy = 0;
    for (int k = 0; k < kIdle; ++k) busy += p[k];
    p[kIdle] = std::max(0.0, s.end_s - busy);
    rc.predicted_memory_bytes = c->prediction.stage_memory_bytes.empty()
                                    ? c->prediction.memory.total
                                    : c->prediction.stage_memory_bytes[size_t(rc.stage)];
  }
}

}  // namespace

bool Comparison::busy() const {
  if (other_cpu_share < 0 || machine_cores <= 0) return other_cpu_share > kBusyShare;
  const double spare = std::max(0, machine_cores - plan.layout.world());
  return other_cpu_share * machine_cores > spare + kBusyShare * machine_cores;
}

std::string LoadNote(const Comparison& c) {
  if (c.other_cpu_share < 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * c.other_cpu_share);
  return "other processes used " + std::string(buf) + " of the cores during the timed steps" +
         (c.busy() ? ": the machine was busy (they took cores the ranks needed), so the measured "
                     "times are not this machine's own"
                   : "");
}

Comparison::ComputeSpread Comparison::MeasuredComputeSpread() const {
  ComputeSpread out;
  if (plan.model.moe()) return out;
  // Per stage, its slowest and fastest rank (one pass: a job may have thousands of ranks).
  struct Stage {
    const RankComparison *slow, *fast;
    int ranks;
  };
  std::map<int, Stage> stages;
  for (const RankComparison& r : ranks) {
    Stage& st = stages.try_emplace(r.stage, Stage{&r, &r, 0}).first->second;
    ++st.ranks;
    if (r.measured[kCompute] > st.slow->measured[kCompute]) st.slow = &r;
    if (r.measured[kCompute] < st.fast->measured[kCompute]) st.fast = &r;
  }
  for (const auto& [stage, st] : stages) {
    const RankComparison *slow = st.slow, *fast = st.fast;
    if (st.ranks < 2 || fast->measured[kCompute] <= 0) continue;
    const double ratio = slow->measured[kCompute] / fast->measured[kCompute];
    if (ratio > out.ratio) out = {ratio, slow->rank, fast->rank};
  }
  return out;
}

std::string SpreadNote(const Comparison& c) {
  const Comparison::ComputeSpread s = c.MeasuredComputeSpread();
  if (!(s.ratio > Comparison::kUnequalCompute)) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "ranks doing the same work computed at unequal speed: rank %d took %.2fx rank "
                "%d's compute time, and every collective waits for the slowest (a busy or "
                "unequal core, a throttled or straggling GPU)",
                s.slow_rank, s.ratio, s.fast_rank);
  return buf;
}

Parts Comparison::PredictedMean() const { return Mean(ranks, true); }
Parts Comparison::MeasuredMean() const { return Mean(ranks, false); }

double Comparison::PredictedMemoryMax() const {
  double m = 0;
  for (const RankComparison& r : ranks) m = std::max(m, r.predicted_memory_bytes);
  return m;
}

double Comparison::MeasuredMemoryMax() const {
  double m = 0;
  for (const RankComparison& r : ranks) m = std::max(m, r.measured_memory_bytes);
  return m;
}

// The predicted step time of layout l of `model` on `cluster` (compare's what-ifs: another
// expert load, the host's speed during the run).
Result<double> PredictStep(const ModelSpec& model, const ClusterSpec& cluster, const Layout& l) {
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(cluster));
  PTDP_ASSIGN_OR_RETURN(AnalyticModel cost, AnalyticModel::Create(model, topo));
  PTDP_ASSIGN_OR_RETURN(const SimResult sim, SimulateStep(cost, l, SimOptions{}));
  return sim.step_time_s;
}

Result<Comparison> ComparePlan(const Plan& plan, const std::string& measured_file,
                               const std::string& cluster_override) {
  Comparison c;
  c.plan = plan;
  c.measured_file = measured_file;
  PTDP_ASSIGN_OR_RETURN(World w, WorldForPlan(plan, cluster_override));
  c.cluster_name = w.cluster.name;
  c.calibrated = w.cost->runtime() != nullptr;
  const Layout& l = plan.layout;
  SimOptions opt;
  opt.record_events = true;
  PTDP_ASSIGN_OR_RETURN(c.sim, SimulateStep(*w.cost, l, opt));
  c.prediction = SimulatedPrediction(*w.cost, l, c.sim);
  c.predicted_step_s = c.sim.step_time_s;
  const RankGrid grid(l.tp, l.cp, l.dp, l.pp, 1, 1);  // the dense grid: stages only
  for (int g = 0; g < l.world(); ++g) {
    RankComparison rc;
    rc.rank = g;
    rc.stage = grid.Coord(g).pp;
    c.ranks.push_back(rc);
  }
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(measured_file, "a measured.json", kMaxMeasuredBytes));
  json probe_json;  // measured.json's speed_probe, when the run timed one
  try {
    const json j = json::parse(text);
    if (!j.is_object() || !j.contains("layout"))
      return Status::Error(measured_file + ": not a measured.json of `ptdp train` (no layout)");
    PTDP_RETURN_IF_ERROR(SameLayout(l, j["layout"], measured_file));
    ReadMeasured(j, measured_file, &c);
    if (j.contains("speed_probe")) probe_json = j["speed_probe"];
  } catch (const std::exception& e) {  // a malformed file: one line naming it
    const std::string what = EscapeBytes(e.what());  // nlohmann quotes the bytes it read
    return Status::Error(what.rfind(measured_file, 0) == 0 ? what : measured_file + ": " + what);
  }
  FillPredicted(w, l, &c);
  const bool moe_load = c.measured_expert_load > 0 && l.ep > 1;
  if (moe_load) {
    // The plan's assumption against the run's routing: the same prediction with the measured
    // expert load in place of moe_dropless_load (the cluster's calibration map overrides it).
    c.predicted_expert_load = w.cost->constants().moe_dropless_load;
    ClusterSpec at_load = w.cluster;
    at_load.calibration["moe_dropless_load"] = c.measured_expert_load;
    PTDP_ASSIGN_OR_RETURN(c.predicted_step_at_measured_load_s, PredictStep(w.model, at_load, l));
  }
  // The host's speed during the run (cli/speed_probe.h) against the calibration's, when both
  // are of the same backend; the prediction at that speed (and at the measured expert load).
  const MeasuredPrimitives& cal = w.cluster.measured;
  if (c.calibrated && probe_json.is_object() &&
      probe_json.value("backend", std::string()) == cal.backend) {
    PTDP_ASSIGN_OR_RETURN(const MeasuredPrimitives probe,
                          SpeedProbeFromJson(probe_json, measured_file, &c.host_drift_within_run));
    if (probe_json.contains("threads") && probe_json["threads"].is_number_integer())
      c.host_probe_threads = std::max(1, probe_json["threads"].get<int>());
    // On as many threads as the run kept cores busy: held against the calibration at that many
    // busy cores (its busy_cores_slowdown), which the prediction already counts.
    auto speed = CompareHostSpeed(cal, probe, c.host_probe_threads);
    if (!speed.ok()) return speed.status().Prefixed(measured_file);
    c.host_speed = *speed;
    ClusterSpec at_speed = w.cluster;
    at_speed.measured = AtHostSpeed(cal, c.host_speed);
    if (moe_load) at_speed.calibration["moe_dropless_load"] = c.measured_expert_load;
    PTDP_ASSIGN_OR_RETURN(c.predicted_step_at_host_speed_s, PredictStep(w.model, at_speed, l));
  }
  return c;
}

json ComparisonJson(const Comparison& c) {
  auto err = [](double p, double m) -> json {
    const double e = ErrorPct(p, m);
    return std::isfinite(e) ? json(e) : json(nullptr);
  };
  auto parts = [](const Parts& p) {
    json j;
    for (int k = 0; k < kNumComponents; ++k) j[std::string(ComponentName(k)) + "_s"] = p[k];
    return j;
  };
  const Parts pm = c.PredictedMean(), mm = c.MeasuredMean();
  json comps = json::object();
  for (int k = 0; k < kNumComponents; ++k)
    comps[ComponentName(k)] = {{"predicted_s", pm[k]}, {"measured_s", mm[k]},
                               {"error_pct", err(pm[k], mm[k])}};
  json ranks = json::array();
  for (const RankComparison& r : c.ranks)
    ranks.push_back({{"rank", r.rank}, {"stage", r.stage}, {"predicted", parts(r.predicted)},
                     {"measured", parts(r.measured)},
                     {"predicted_memory_bytes", r.predicted_memory_bytes},
                     {"measured_memory_bytes", r.measured_memory_bytes},
                     {"memory_error_pct", err(r.predicted_memory_bytes, r.measured_memory_bytes)}});
  json load = nullptr;  // MoE with ep > 1: the routing assumed and measured
  if (c.predicted_step_at_measured_load_s > 0)
    load = {{"predicted", c.predicted_expert_load},
            {"measured", c.measured_expert_load},
            {"predicted_step_time_s", c.predicted_step_at_measured_load_s},
            {"step_time_error_pct", err(c.predicted_step_at_measured_load_s, c.measured_step_s)}};
  json speed = nullptr;  // the host's speed during the run against its calibration
  if (c.host_speed.points > 0) {
    json tables = json::object();
    for (const auto& [name, ratio] : c.host_speed.by_table) tables[name] = ratio;
    speed = {{"ratio", c.host_speed.overall},
             {"by_table", tables},
             {"points", c.host_speed.points},
             {"threads", c.host_probe_threads},
             {"drift_within_run", c.host_drift_within_run},
             {"predicted_step_time_s", c.predicted_step_at_host_speed_s},
             {"step_time_error_pct", err(c.predicted_step_at_host_speed_s, c.measured_step_s)}};
  }
  json spread = nullptr;  // ranks doing the same work: the slowest's compute over the fastest's
  if (const Comparison::ComputeSpread cs = c.MeasuredComputeSpread(); cs.ratio > 0)
    spread = {{"ratio", cs.ratio}, {"slow_rank", cs.slow_rank}, {"fast_rank", cs.fast_rank},
              {"unequal", cs.ratio > Comparison::kUnequalCompute}};
  return {{"step_time_error_pct", err(c.predicted_step_s, c.measured_step_s)},
          {"expert_load", load},
          {"host_speed", speed},
          {"compute_spread", spread},
          {"memory_error_pct", err(c.PredictedMemoryMax(), c.MeasuredMemoryMax())},
          {"predicted_step_time_s", c.predicted_step_s},
          {"measured_step_time_s", c.measured_step_s},
          {"measured_step_time_min_s", c.measured_step_min_s},
          {"measured_step_time_max_s", c.measured_step_max_s},
          {"warmup_steps", c.warmup_steps},
          {"timed_steps", c.timed_steps},
          {"predicted_memory_bytes", c.PredictedMemoryMax()},
          {"measured_memory_bytes", c.MeasuredMemoryMax()},
          {"other_cpu_share", c.other_cpu_share >= 0 ? json(c.other_cpu_share) : json(nullptr)},
          {"machine_busy", c.busy()},
          {"calibrated", c.calibrated},
          {"components", comps},
          {"ranks", ranks},
          {"layout", LayoutJson(c.plan.layout, c.plan.model)},
          {"model", c.plan.model.name},
          {"cluster", c.cluster_name},
          {"measured_file", c.measured_file},
          {"backend", c.backend},
          {"host", c.host}};
}

}  // namespace ptdp::cli
