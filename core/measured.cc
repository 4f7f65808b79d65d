// MeasuredPrimitives: the table kinds, grid interpolation and the `measured:` YAML block.
#include "core/measured.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/limits.h"
#include "core/yaml_reader.h"

namespace ptdp {

const std::vector<TableKind>& MeasuredTableKinds() {
  // Exponents past the grid: a GEMM's time grows with each of m, n, k; attention with s^2 d;
  // row-wise ops with rows and columns; element-wise ops and transfers with their size;
  // collectives also with the ranks (ranks sharing the cores take turns).
  static const std::vector<TableKind> kinds = {
      {"gemm_nt", {{"m", 1}, {"n", 1}, {"k", 1}},
       "C(m,n) = A(m,k) B(n,k)^T: a linear layer's forward (x w^T)"},
      {"gemm_nn", {{"m", 1}, {"n", 1}, {"k", 1}},
       "C(m,n) = A(m,k) B(k,n): a linear layer's input gradient (dy w)"},
      {"gemm_tn", {{"m", 1}, {"n", 1}, {"k", 1}},
       "C(m,n) += A(k,m)^T B(k,n): a linear layer's weight gradient (dy^T x)"},
      // Where the backend runs a linear layer's bias (and GeLU) in the GEMM's epilogue (CUDA:
      // cuBLASLt): the fused call, timed over gemm_nt's grid.
      {"gemm_nt_bias", {{"m", 1}, {"n", 1}, {"k", 1}},
       "C(m,n) = A(m,k) B(n,k)^T + bias(n) in one call (the GEMM's epilogue)", true},
      {"gemm_nt_bias_gelu", {{"m", 1}, {"n", 1}, {"k", 1}},
       "the same, then GeLU; the pre-activation kept (FC1's forward)", true},
      {"gemm_nn_dgelu", {{"m", 1}, {"n", 1}, {"k", 1}},
       "C(m,n) = gelu'(P(m,n)) * (A(m,k) B(k,n)) in one call: FC2's input gradient through the "
       "GeLU", true},
      {"attention_forward", {{"s", 2}, {"d", 1}},
       "causal attention core of one (batch, head): QK^T, softmax, PV"},
      {"attention_backward", {{"s", 2}, {"d", 1}}, "its backward, one (batch, head)"},
      // Context parallelism's ring (runtime/gpt.cc): s = the rows a CP rank holds (two
      // chunks of s/2), one (batch, head); the rank's own K/V block (two causal chunk pairs
      // and one full) and another rank's (two full pairs), merged into the output.
      {"attention_block_diagonal_forward", {{"s", 2}, {"d", 1}},
       "CP ring step 0: a rank's queries against its own K/V block, merged"},
      {"attention_block_diagonal_backward", {{"s", 2}, {"d", 1}}, "its backward"},
      {"attention_block_forward", {{"s", 2}, {"d", 1}},
       "CP ring step > 0: a rank's queries against another rank's K/V block, merged"},
      {"attention_block_backward", {{"s", 2}, {"d", 1}}, "its backward"},
      {"layernorm_forward", {{"rows", 1}, {"cols", 1}}, "LayerNorm over cols, saving mean/rstd"},
      {"layernorm_backward", {{"rows", 1}, {"cols", 1}}, "LayerNorm backward (dx, dgamma, dbeta)"},
      {"bias_add", {{"rows", 1}, {"cols", 1}}, "y (rows, cols) += bias (cols)"},
      {"bias_grad", {{"rows", 1}, {"cols", 1}}, "dbias (cols) += column sums of dy"},
      {"bias_residual", {{"rows", 1}, {"cols", 1}},
       "x (rows, cols) += bias (cols) + residual in one kernel (FC2's output)", true},
      {"bias_residual_layernorm", {{"rows", 1}, {"cols", 1}},
       "the same, then LayerNorm of x (the projection's output into the next norm)", true},
      {"embedding_forward", {{"rows", 1}, {"cols", 1}}, "table lookup of rows tokens, cols wide"},
      {"embedding_backward", {{"rows", 1}, {"cols", 1}}, "scatter-add of rows gradients"},
      {"cross_entropy_forward", {{"rows", 1}, {"cols", 1}},
       "vocab-parallel loss pieces over (rows, cols) logits: max, sum exp, target, loss"},
      {"cross_entropy_backward", {{"rows", 1}, {"cols", 1}}, "dlogits in place"},
      // tanh's cost depends on its argument's magnitude (libm takes different paths), so GeLU
      // is measured over the standard deviation of its normal inputs too.
      {"gelu_forward", {{"elements", 1}, {"sigma", 0}}, "GeLU (tanh) of N(0, sigma^2) inputs"},
      {"gelu_backward", {{"elements", 1}, {"sigma", 0}}, "GeLU backward"},
      {"add", {{"elements", 1}}, "out = a + b (residual)"},
      {"copy", {{"elements", 1}}, "dst = src"},
      {"scale", {{"elements", 1}}, "x *= alpha"},
      {"fill", {{"elements", 1}}, "x = value (zeroing gradients)"},
      {"sum_squares", {{"elements", 1}}, "sum of squares (gradient norm)"},
      {"adamw", {{"elements", 1}}, "one AdamW step on fp32 param, grad, m, v"},
      {"alloc", {{"bytes", 1}}, "allocate an uninitialised tensor and release it"},
      {"all_reduce", {{"ranks", 1}, {"bytes", 1}}, "all-reduce (sum) of a buffer of bytes"},
      {"all_gather", {{"ranks", 1}, {"bytes", 1}}, "all-gather; bytes of the gathered output"},
      {"reduce_scatter", {{"ranks", 1}, {"bytes", 1}},
       "reduce-scatter (sum); bytes of the full input"},
      {"send_recv", {{"bytes", 1}}, "one grouped send/receive between two ranks"},
      {"ring_exchange", {{"ranks", 1}, {"bytes", 1}},
       "each rank sends bytes to the next and receives as many from the previous (CP ring)"},
      {"all_to_all", {{"ranks", 1}, {"bytes", 1}},
       "all-to-all, equal blocks; bytes of each rank's whole send buffer (MoE dispatch)"},
  };
  return kinds;
}

std::vector<double> TableKind::Exponents() const {
  std::vector<double> e;
  for (const TableAxis& a : axes) e.push_back(a.exponent);
  return e;
}

const TableKind* FindTableKind(const std::string& name) {
  for (const TableKind& k : MeasuredTableKinds())
    if (name == k.name) return &k;
  return nullptr;
}

MeasuredTable::MeasuredTable(std::vector<std::vector<double>> axis_values,
                             std::vector<double> seconds, std::vector<double> exponents)
    : axes_(std::move(axis_values)), seconds_(std::move(seconds)), exponents_(std::move(exponents)) {
  log_seconds_.reserve(seconds_.size());
  for (double s : seconds_) log_seconds_.push_back(std::log(s));
}

Result<MeasuredTable> MeasuredTable::FromRows(const std::vector<std::vector<double>>& rows,
                                              const std::vector<double>& exponents,
                                              const std::string& where) {
  const size_t dims = exponents.size();
  if (dims < 1 || dims > kMaxDims) return Status::Error(where + ": tables have 1 to 3 axes");
  std::vector<std::set<double>> values(dims);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double>& row = rows[i];
    const std::string at = where + " row " + std::to_string(i + 1);
    if (row.size() != dims + 1)
      return Status::Error(at + ": expected " + std::to_string(dims + 1) + " numbers, got " +
                           std::to_string(row.size()));
    for (size_t k = 0; k < row.size(); ++k) {
      const bool time = k == dims;
      if (Status st = CheckRange(row[k], time ? limits::kMeasuredSeconds : limits::kTableAxis);
          !st.ok())
        return st.Prefixed(at + (time ? ": seconds" : ": axis value"));
    }
    for (size_t a = 0; a < dims; ++a) values[a].insert(row[a]);
  }
  if (rows.empty()) return Status::Error(where + ": no rows");
  std::vector<std::vector<double>> axes(dims);
  size_t points = 1;
  for (size_t a = 0; a < dims; ++a) {
    axes[a].assign(values[a].begin(), values[a].end());
    points *= axes[a].size();
  }
  std::vector<double> seconds(points, 0.0);
  for (const std::vector<double>& row : rows) {
    size_t index = 0;
    for (size_t a = 0; a < dims; ++a) {
      const size_t j = size_t(std::lower_bound(axes[a].begin(), axes[a].end(), row[a]) -
                              axes[a].begin());
      index = index * axes[a].size() + j;
    }
    if (seconds[index] != 0) return Status::Error(where + ": a point is given twice");
    seconds[index] = row[dims];
  }
  if (rows.size() != points)
    return Status::Error(where + ": " + std::to_string(rows.size()) + " rows do not fill the " +
                         std::to_string(points) + "-point grid of their axis values");
  return MeasuredTable(std::move(axes), std::move(seconds), exponents);
}

double MeasuredTable::Seconds(const double* at) const {
  const size_t dims = axes_.size();
  assert(dims >= 1 && dims <= kMaxDims && !seconds_.empty());
  // Per axis: the two grid indices around the value, the weight of the upper one, and the
  // scale factor for a value past the grid.
  size_t lo[kMaxDims] = {}, hi[kMaxDims] = {};
  double w[kMaxDims] = {};
  double scale = 1.0;
  for (size_t a = 0; a < dims; ++a) {
    const std::vector<double>& v = axes_[a];
    const double x = at[a];
    if (x <= v.front()) {
      lo[a] = hi[a] = 0;  // a floor: the smallest point's time
    } else if (x >= v.back()) {
      lo[a] = hi[a] = v.size() - 1;
      scale *= std::pow(x / v.back(), exponents_[a]);
    } else {
      const size_t j = size_t(std::upper_bound(v.begin(), v.end(), x) - v.begin());
      lo[a] = j - 1;
      hi[a] = j;
      w[a] = std::log(x / v[j - 1]) / std::log(v[j] / v[j - 1]);
    }
  }
  // Multilinear interpolation of log(seconds) over the 2^dims corners.
  double log_s = 0;
  for (size_t corner = 0; corner < (size_t(1) << dims); ++corner) {
    double weight = 1;
    size_t index = 0;
    for (size_t a = 0; a < dims; ++a) {
      const bool up = (corner >> a) & 1;
      weight *= up ? w[a] : 1 - w[a];
      index = index * axes_[a].size() + (up ? hi[a] : lo[a]);
    }
    if (weight != 0) log_s += weight * log_seconds_[index];
  }
  return std::exp(log_s) * scale;
}

std::vector<std::vector<double>> MeasuredTable::Rows() const {
  std::vector<std::vector<double>> rows;
  rows.reserve(seconds_.size());
  const size_t dims = axes_.size();
  for (size_t i = 0; i < seconds_.size(); ++i) {
    std::vector<double> row(dims + 1);
    size_t rest = i;
    for (size_t a = dims; a-- > 0;) {
      row[a] = axes_[a][rest % axes_[a].size()];
      rest /= axes_[a].size();
    }
    row[dims] = seconds_[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

MeasuredTable MeasuredTable::Scaled(double factor) const {
  std::vector<double> seconds = seconds_;
  for (double& t : seconds) t *= factor;
  return MeasuredTable(axes_, std::move(seconds), exponents_);
}

double MeasuredPrimitives::BusyCoresFactor(double busy) const {
  if (cores <= 1 || busy <= 1) return 1;
  return 1 + (busy_cores_slowdown - 1) * (std::min(busy, double(cores)) - 1) / (cores - 1);
}

Result<HostSpeed> CompareHostSpeed(const MeasuredPrimitives& calibrated,
                                   const MeasuredPrimitives& probe, int threads) {
  const double busy = calibrated.BusyCoresFactor(threads);
  HostSpeed speed;
  double all = 0;
  for (const auto& [name, table] : probe.tables) {
    const MeasuredTable* cal = calibrated.Table(name);
    if (!cal) {
      // A table the calibration may lack (its backend did not fuse the call, or it predates
      // the table): the model times those calls by the other tables, which the probe holds.
      if (const TableKind* kind = FindTableKind(name); kind != nullptr && kind->optional) continue;
      return Status::Error("speed probe: table " + name + " is not in the calibration");
    }
    if (cal->dims() != table.dims())
      return Status::Error("speed probe: table " + name + " has " + std::to_string(table.dims()) +
                           (table.dims() == 1 ? " axis" : " axes") + ", the calibration's " +
                           std::to_string(cal->dims()));
    double sum = 0;
    int n = 0;
    for (const std::vector<double>& row : table.Rows()) {
      const double r = std::log(row.back() / (cal->Seconds(row.data()) * busy));
      sum += r;
      ++n;
    }
    if (n == 0) continue;
    speed.by_table[name] = std::exp(sum / n);
    all += sum;
    speed.points += n;
  }
  if (speed.points == 0) return Status::Error("speed probe: no point to compare");
  speed.overall = std::exp(all / speed.points);
  return speed;
}

MeasuredPrimitives AtHostSpeed(const MeasuredPrimitives& calibrated, const HostSpeed& speed) {
  MeasuredPrimitives m = calibrated;
  for (const auto& [name, ratio] : speed.by_table)
    if (auto it = m.tables.find(name); it != m.tables.end()) it->second = it->second.Scaled(ratio);
  return m;
}

const MeasuredTable* MeasuredPrimitives::Table(const std::string& name) const {
  auto it = tables.find(name);
  return it == tables.end() ? nullptr : &it->second;
}

Status MeasuredPrimitives::CheckComplete(const std::string& file) const {
  std::string missing;
  for (const TableKind& k : MeasuredTableKinds())
    if (!k.optional && !Table(k.name))
      missing += (missing.empty() ? "" : ", ") + std::string(k.name);
  if (!missing.empty())
    return Status::Error(file + ": measured.tables lacks " + missing +
                         " (run `ptdp calibrate` to measure them all)");
  return Status::Ok();
}

namespace {

Result<std::vector<std::vector<double>>> ReadRows(const YAML::Node& node, const std::string& where) {
  if (!node.IsSequence()) return Status::Error(where + ": expected a list of rows [..., seconds]");
  std::vector<std::vector<double>> rows;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node row = node[i];
    const std::string at = where + " row " + std::to_string(i + 1);
    if (!row.IsSequence()) return Status::Error(at + ": expected a list of numbers");
    std::vector<double> v;
    for (const YAML::Node& x : row) {
      const std::string text = x.IsScalar() ? x.Scalar() : "";
      char* end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size())
        return Status::Error(at + ": '" + text + "' is not a number");
      v.push_back(d);
    }
    rows.push_back(std::move(v));
  }
  return rows;
}

// %.6g is enough for measured times (they are noisy to a few percent); axis values (sizes) are
// written exactly.
std::string Num(double v, int digits = 6) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

Result<MeasuredPrimitives> MeasuredFromYaml(const YAML::Node& node, const std::string& file) {
  YamlReader r(node, file, "measured");
  MeasuredPrimitives m;
  m.backend = r.Enum("backend", {"cpu", "cuda"}, "cpu");
  m.communicator = r.Enum("communicator", {"threads", "device", "nccl"}, "");
  m.host = r.String("host", "");
  m.date = r.String("date", "");
  m.note = r.String("note", "");
  m.cores = r.PositiveIntAtMost("cores", kMaxCores, 1);
  m.element_bytes = r.Number("element_bytes", limits::kElementBytes, 4);
  m.busy_cores_slowdown = r.Number("busy_cores_slowdown", limits::kBusyCoresSlowdown, 1);
  const YAML::Node saved = r.Child("attention_saved");
  const YAML::Node tables = r.Child("tables");
  if (!tables.IsDefined() || tables.IsNull()) r.Fail("tables", "missing required key");
  PTDP_RETURN_IF_ERROR(r.Finish());
  if (saved.IsDefined() && !saved.IsNull()) {
    YamlReader s(saved, file, "measured.attention_saved");
    m.attention_saved_per_score = s.Number("per_score", limits::kAttentionSaved, 0);
    m.attention_saved_per_token = s.Number("per_token", limits::kAttentionSaved, 0);
    PTDP_RETURN_IF_ERROR(s.Finish());
  }
  if (!tables.IsMap())
    return Status::Error(file + ":" + std::to_string(tables.Mark().line + 1) +
                         ": measured.tables: expected a map of table name -> rows");
  for (auto it = tables.begin(); it != tables.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string where =
        file + ":" + std::to_string(it->first.Mark().line + 1) + ": measured.tables." + name;
    const TableKind* kind = FindTableKind(name);
    if (!kind) {
      std::string valid;
      for (const TableKind& k : MeasuredTableKinds()) valid += (valid.empty() ? "" : ", ") + std::string(k.name);
      return Status::Error(where + ": unknown table (valid: " + valid + ")");
    }
    PTDP_ASSIGN_OR_RETURN(auto rows, ReadRows(it->second, where));
    PTDP_ASSIGN_OR_RETURN(MeasuredTable t, MeasuredTable::FromRows(rows, kind->Exponents(), where));
    m.tables[name] = std::move(t);
  }
  return m;
}

std::string MeasuredToYaml(const MeasuredPrimitives& m) {
  std::ostringstream o;
  o << "# Written by `ptdp calibrate`: this machine's primitives, measured through the runtime's\n"
       "# Backend and Communicator. Rows are [axis values..., seconds]; the cost model\n"
       "# interpolates them (docs/cost-model.md, \"Measured primitives\").\n"
    << "measured:\n"
    << "  backend: " << m.backend << "\n";
  if (!m.communicator.empty())
    o << "  communicator: " << m.communicator << "     # the collectives' (threads, device, nccl)\n";
  if (!m.host.empty()) o << "  host: " << YamlQuote(m.host) << "\n";
  if (!m.date.empty()) o << "  date: " << YamlQuote(m.date) << "\n";
  if (!m.note.empty()) o << "  note: " << YamlQuote(m.note) << "\n";
  o << "  cores: " << m.cores << "                 # ranks that compute at once at full speed\n"
    << "  element_bytes: " << Num(m.element_bytes) << "         # bytes per stored tensor element\n"
    << "  busy_cores_slowdown: " << Num(m.busy_cores_slowdown, 4)
    << "   # each op's time with every core busy over one core alone\n"
    << "  attention_saved:         # elements saved per (batch, head) for the backward\n";
  if (m.attention_saved_per_score > 0)
    o << "    per_score: " << Num(m.attention_saved_per_score) << "\n";
  if (m.attention_saved_per_token > 0)
    o << "    per_token: " << Num(m.attention_saved_per_token) << "\n";
  if (m.attention_saved_per_score <= 0 && m.attention_saved_per_token <= 0) o << "    {}\n";
  o << "  tables:\n";
  for (const TableKind& k : MeasuredTableKinds()) {
    const MeasuredTable* t = m.Table(k.name);
    if (!t) continue;
    o << "    " << k.name << ":   # [";
    for (const TableAxis& a : k.axes) o << a.name << ", ";
    o << "seconds] " << k.what << "\n";
    for (const std::vector<double>& row : t->Rows()) {
      o << "      - [";
      for (size_t i = 0; i < row.size(); ++i)
        o << (i ? ", " : "") << Num(row[i], i + 1 < row.size() ? 15 : 6);
      o << "]\n";
    }
  }
  return o.str();
}

}  // namespace ptdp
