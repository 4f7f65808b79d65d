// Readers of published measured runs; see calibration_data.h.
#include "cost_model/calibration_data.h"

#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "core/plan.h"
#include "core/yaml_reader.h"

namespace ptdp {
namespace {

bool Contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// The GPU generation from its full name ("H100-SXM5-80GB", "GB200 (NVL72)"): A100, H100, B200,
// B300, GB200 or GB300, the key of the base clusters (GB before B: "GB200" holds "B200").
std::string GpuKind(const std::string& gpu) {
  for (const char* kind : {"H100", "A100", "GB200", "GB300", "B200", "B300"})
    if (Contains(gpu, kind)) return kind;
  return gpu;
}

std::string Str(const YAML::Node& n) { return n && n.IsScalar() ? n.Scalar() : ""; }

// Architecture family from the model name: Llama (SwiGLU, RMSNorm, RoPE, untied, no bias),
// Nemotron-4 (squared ReLU, LayerNorm, RoPE, untied, no bias), else GPT. Llama and Nemotron-4
// train without dropout in every framework the sources ran: NeMo 2's LlamaConfig and
// NemotronConfig (hidden_dropout = attention_dropout = 0.0), Megatron-Bridge's LlamaBridge
// (hidden_dropout=0.0; attention_dropout from the HF config, 0.0 for Llama 3) and the NeMo
// launcher's nemotron_340b.yaml (hidden_dropout: 0.0). GPT keeps Megatron's 0.1: the NeMo
// launcher's gpt3/175b.yaml trains with hidden_dropout 0.1.
void SetFamily(const std::string& name, ModelSpec* m) {
  std::string lower;
  for (char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (Contains(lower, "llama")) {
    m->activation = Activation::kSwiglu;
    m->norm = Norm::kRmsNorm;
  } else if (Contains(lower, "nemotron")) {
    m->activation = Activation::kSquaredRelu;
    m->norm = Norm::kLayerNorm;
  } else {
    return;  // GPT defaults
  }
  m->position = PositionEmbedding::kRope;
  m->tied_embeddings = false;
  m->bias = false;
  m->dropout = false;
}

// Returns "" on success, or why the entry cannot be used.
std::string ReadEntry(const YAML::Node& e, MeasuredRun* run) {
  run->id = Str(e["id"]);
  // source: {title, location}, as runs.yaml's "title; location" (scripts/import-published.py).
  const YAML::Node src = e["source"];
  run->source = src && src.IsMap() ? Str(src["title"]) + "; " + Str(src["location"]) : Str(src);
  const YAML::Node model = e["model"], hw = e["hardware"], lay = e["layout"], meas = e["measured"];
  if (!model || !hw || !lay || !meas) return "missing model/hardware/layout/measured";
  for (const char* k : {"layers", "hidden", "heads", "seq", "vocab"})
    if (!model[k] || model[k].IsNull()) return std::string("model.") + k + " not given";
  for (const char* k : {"tp", "pp", "dp", "microbatch", "global_batch"})
    if (!lay[k] || lay[k].IsNull()) return std::string("layout.") + k + " not given";
  ModelSpec& m = run->model;
  m.name = Str(model["name"]);
  m.layers = model["layers"].as<int64_t>();
  m.hidden = model["hidden"].as<int64_t>();
  m.heads = model["heads"].as<int64_t>();
  m.kv_heads = model["kv_heads"] && !model["kv_heads"].IsNull() ? model["kv_heads"].as<int64_t>() : m.heads;
  m.seq_len = model["seq"].as<int64_t>();
  m.vocab = model["vocab"].as<int64_t>();
  SetFamily(m.name, &m);
  if (model["ffn"] && !model["ffn"].IsNull()) m.ffn_hidden = model["ffn"].as<int64_t>();
  else if (m.activation == Activation::kGelu) m.ffn_hidden = 4 * m.hidden;
  else return "model.ffn not given";

  Layout& l = run->layout;
  l.tp = lay["tp"].as<int>();
  l.pp = lay["pp"].as<int>();
  l.dp = lay["dp"].as<int>();
  l.cp = lay["cp"] && !lay["cp"].IsNull() ? lay["cp"].as<int>() : 1;
  l.vp = lay["vp"] && !lay["vp"].IsNull() ? lay["vp"].as<int>() : 1;
  l.schedule = l.vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  l.micro_batch = lay["microbatch"].as<int>();
  l.global_batch = lay["global_batch"].as<int64_t>();
  // SP unstated: NeMo enables it with TP in these recipes.
  l.sequence_parallel = lay["sp"] && !lay["sp"].IsNull() ? lay["sp"].as<bool>() : l.tp > 1;
  const std::string rc = Str(lay["recompute"]);
  l.recompute = rc.rfind("full", 0) == 0        ? Recompute::kFull
                : rc.rfind("selective", 0) == 0 ? Recompute::kSelective
                                                : Recompute::kNone;
  const std::string prec = Str(lay["precision"]);
  l.precision = Contains(prec, "fp8") || Contains(prec, "FP8")   ? Precision::kFp8
                : Contains(prec, "fp4") || Contains(prec, "FP4") ? Precision::kFp4
                                                                 : Precision::kBf16;
  // Unstated in a NeMo-based recipe row: distributed_fused_adam (NeMo-Framework-Launcher's
  // GPT-3, Llama and Nemotron configs) or Megatron-Bridge's use_distributed_optimizer, as the
  // rows that state it say ("DDP (distributed optimizer not stated)" is that default).
  const std::string opt = Str(lay["optimizer_sharding"]);
  const bool recipe = Contains(run->id, "nemo2407") || Contains(run->id, "megatron_bridge") ||
                      Contains(run->id, "dgxc_");
  l.distributed_optimizer =
      Contains(opt, "distributed") || Contains(opt, "FSDP") || (opt.empty() && recipe);
  l.overlap_grad_reduce = true;
  // TP communication overlap: stated in some entries' notes; the NeMo-based recipes (dgxc,
  // NeMo 24.07 table, Megatron-Bridge) turn on Transformer Engine's userbuffer overlap in all
  // their GPT/Llama/Nemotron configs, so it is on for their rows. A property of the software
  // that produced the row, read from its source, not a per-row tuning knob.
  // Megatron asserts that it needs SP (at tp 1 SP is off, and the recipes turn the overlap off).
  l.tp_comm_overlap = (Contains(Str(lay["notes"]), "TP comm overlap") ||
                       Contains(run->id, "dgxc_") || Contains(run->id, "nemo2407") ||
                       Contains(run->id, "megatron_bridge")) &&
                      l.sequence_parallel;
  // Megatron-Bridge's performance recipes keep the gradient buffers in bf16 (their
  // mixed-precision presets with grad_reduce_in_fp32 False: perf_recipes/_common.py
  // _perf_precision, scripts/performance's get_precision_config), as import-published.py
  // sets for its megatron_recipes rows.
  l.grad_reduce_in_bf16 = Contains(run->id, "megatron_bridge");
  // ... and compute the loss with Transformer Engine's kernel (cross_entropy_fusion_impl "te":
  // import-published.py's mb_cross_entropy).
  if (Contains(run->id, "megatron_bridge")) l.cross_entropy = CrossEntropyFusion::kTe;
  // Its Llama 3.1 405B recipe counts the embedding and the loss in the pipeline split
  // (recipes/llama/llama3.py llama31_405b_pretrain_config), as import-published.py reads it.
  if (Contains(run->id, "megatron_bridge") &&
      (Contains(run->model.name, "405B") || Contains(run->model.name, "405b")))
    l.embedding_in_split = l.loss_in_split = true;
  run->gpu = GpuKind(Str(hw["gpu"]));
  run->gpus = hw["total_gpus"].as<int>();
  if (meas["per_layer_combined_ms"] && !meas["per_layer_combined_ms"].IsNull()) {
    run->per_layer = true;
    run->measured_s = meas["per_layer_combined_ms"].as<double>() / 1e3;
    return "";
  }
  if (meas["step_time_s"] && !meas["step_time_s"].IsNull())
    run->measured_s = meas["step_time_s"].as<double>();
  else if (e["derived"] && e["derived"]["step_time_s"])
    run->measured_s = e["derived"]["step_time_s"].as<double>();
  else
    return "no step time";
  if (l.world() != run->gpus) return "tp*cp*pp*dp != total_gpus";
  return "";
}

Result<MeasuredRun> ReadPublishedRow(const YAML::Node& node, const std::string& file,
                                     size_t index) {
  const std::string where = "runs[" + std::to_string(index) + "]";
  YamlReader r(node, file, where);
  MeasuredRun run;
  run.id = r.String("id");
  run.source = r.String("source");
  r.String("table", "");  // where in the source (table, column): a citation detail
  run.family = r.String("family", "");  // the model family (MoE rows), for validate's groups
  run.gpu = GpuKind(r.String("gpu"));
  run.gpus = r.PositiveIntAtMost("gpus", kMaxWorldSize);
  for (const char* key : {"model", "layout"})
    if (!r.Has(key)) return Status::Error(r.Where("") + ": " + where + ": missing key '" + key + "'");
  PTDP_ASSIGN_OR_RETURN(run.model, ModelFromYaml(r.Child("model"), file, where + ".model"));
  PTDP_ASSIGN_OR_RETURN(run.layout, LayoutFromYaml(r.Child("layout"), file, where + ".layout", run.model));
  const bool layer = r.Has("layer_fwd_bwd_ms");
  if (layer == r.Has("step_time_s"))
    r.Fail("step_time_s", "give exactly one of step_time_s and layer_fwd_bwd_ms");
  run.per_layer = layer;
  run.measured_s = layer ? r.PositiveNumber("layer_fwd_bwd_ms", 0) / 1e3
                         : r.PositiveNumber("step_time_s", 0);
  r.Bool("step_time_derived", false);
  r.Child("published");  // the source's cells as printed
  if (run.layout.world() != run.gpus)
    r.Fail("gpus", "'" + std::to_string(run.gpus) + "' is not tp*cp*pp*dp = " +
                       std::to_string(run.layout.world()));
  PTDP_RETURN_IF_ERROR(r.Finish());
  return run;
}

}  // namespace

Result<CalibrationSet> LoadPublishedRuns(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path, "a published-runs YAML", kMaxDataBytes));
  YamlReader r(root, path, "");
  if (r.PositiveInt("ptdp_published_runs_version") != 1)
    r.Fail("ptdp_published_runs_version", "only version 1 is understood");
  const YAML::Node runs = r.Child("runs");
  const YAML::Node dropped = r.Child("not_carried");
  PTDP_RETURN_IF_ERROR(r.Finish());
  if (!runs || !runs.IsSequence()) return Status::Error(path + ": 'runs' must be a list");
  CalibrationSet set;
  for (size_t i = 0; i < runs.size(); ++i) {
    PTDP_ASSIGN_OR_RETURN(MeasuredRun run, ReadPublishedRow(runs[i], path, i));
    set.runs.push_back(std::move(run));
  }
  const bool has_dropped = dropped && !dropped.IsNull();
  if (has_dropped && !dropped.IsSequence())
    return Status::Error(path + ": 'not_carried' must be a list");
  for (size_t i = 0; has_dropped && i < dropped.size(); ++i) {
    YamlReader d(dropped[i], path, "not_carried[" + std::to_string(i) + "]");
    const std::string id = d.String("id");
    const std::string why = d.String("why");
    PTDP_RETURN_IF_ERROR(d.Finish());
    set.skipped.push_back(id + ": " + why);
  }
  return set;
}

Result<CalibrationSet> LoadMeasuredRuns(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path, "a measured-runs YAML", kMaxDataBytes));
  const YAML::Node entries = root["entries"];
  if (!entries || !entries.IsSequence())
    return Status::Error(path + ": missing 'entries' list");
  CalibrationSet set;
  for (const auto& e : entries) {
    MeasuredRun run;
    std::string why;
    try {
      why = ReadEntry(e, &run);
    } catch (const YAML::Exception& ex) {
      why = std::string("unreadable field: ") + ex.what();
    }
    if (why.empty()) set.runs.push_back(run);
    else set.skipped.push_back(run.id + ": " + why);
  }
  return set;
}

const char* const kVtrainSource =
    "vTrain (Bang et al. 2024, MICRO): single-node A100 runs, vtrain_single_node/measured.csv";

Result<CalibrationSet> LoadVtrainCsv(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(path, "a vTrain CSV", kMaxDataBytes));
  std::istringstream in(text);
  CalibrationSet set;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::stringstream ss(line);
    std::vector<double> v;
    std::string cell;
    while (std::getline(ss, cell, ',')) v.push_back(std::atof(cell.c_str()));
    if (v.size() != 11)
      return Status::Error(path + ":" + std::to_string(lineno) + ": expected 11 columns");
    MeasuredRun run;
    run.id = "vtrain:" + std::to_string(lineno);
    run.source = kVtrainSource;
    run.gpu = "A100";
    run.gpus = int(v[0]);
    ModelSpec& m = run.model;
    m.name = "vtrain-gpt";
    m.hidden = int64_t(v[3]);
    m.heads = int64_t(v[4]);
    m.kv_heads = m.heads;
    m.layers = int64_t(v[5]);
    m.seq_len = int64_t(v[6]);
    m.ffn_hidden = 4 * m.hidden;
    m.vocab = 50257;  // GPT-2 tokenizer, the Megatron-DeepSpeed default (source README)
    Layout& l = run.layout;
    l.global_batch = int64_t(v[1]);
    l.micro_batch = int(v[2]);
    l.tp = int(v[7]);
    l.dp = int(v[8]);
    l.pp = int(v[9]);
    // The micro-batch column is taken as run: its times show gradient accumulation with
    // p = 1 too (row 1097: t 8, B 16, b 1 takes 1.95 s, 16 micro-batches' worth).
    l.recompute = Recompute::kFull;
    l.precision = Precision::kFp16;
    l.overlap_grad_reduce = false;  // "no gradient bucketing"
    run.measured_s = v[10] / 1e3;
    if (l.world() != run.gpus || CheckLayout(m, l) != Rejection::kOk) {
      set.skipped.push_back(run.id + ": layout inconsistent");
      continue;
    }
    set.runs.push_back(run);
  }
  return set;
}

}  // namespace ptdp
