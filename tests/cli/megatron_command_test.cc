// `--emit megatron` (issue 15): every command passes the Megatron-LM argument checks that can be
// read statically. Every flag after pretrain_gpt.py is one Megatron-LM defines
// (tests/data/megatron_flags.txt, scripts/megatron-flags.py at NVIDIA/Megatron-LM d98e8a6),
// --tp-comm-overlap comes only with --sequence-parallel, torchrun starts exactly the plan's
// world, the model's MoE/MLA values are Megatron's, and what a plan cannot know is a marked
// placeholder that the script checks before it starts. Plans are built directly where the
// planner does not search the knob (expert parallelism), and through the binary otherwise.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/megatron_command.h"
#include "core/layout.h"
#include "core/model.h"
#include "core/plan.h"
#include "tests/fakes/shell.h"

namespace ptdp::cli {
namespace {

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";

using ptdp::testing::CmdResult;
using ptdp::testing::ExpectOneLineError;

CmdResult Ptdp(const std::string& args) { return ptdp::testing::Shell(kBin + " " + args); }

std::string ModelFile(const std::string& name) { return kSrc + "/configs/models/" + name + ".yaml"; }
std::string ClusterFile(const std::string& name) {
  return kSrc + "/configs/clusters/" + name + ".yaml";
}

const std::set<std::string>& MegatronFlags() {
  static const std::set<std::string> flags = [] {
    std::set<std::string> s;
    std::ifstream in(kSrc + "/tests/data/megatron_flags.txt");
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '#') s.insert(line);
    return s;
  }();
  return flags;
}

// The script parsed: its comment lines, torchrun's arguments and pretrain_gpt.py's flags with
// their values.
struct Script {
  std::string text;
  std::vector<std::string> comments, checks;  // "# ..." lines; ': "${X:?...}"' lines
  std::vector<std::string> torchrun;          // tokens before pretrain_gpt.py (or _hybrid)
  std::string script;                         // the training script torchrun runs
  std::vector<std::pair<std::string, std::string>> args;  // flag, its values joined by ' '
  int nproc = 0, nnodes = 0;

  bool Has(const std::string& flag) const {
    for (const auto& [f, v] : args)
      if (f == flag) return true;
    return false;
  }
  std::string Value(const std::string& flag) const {
    for (const auto& [f, v] : args)
      if (f == flag) return v;
    return "<" + flag + " missing>";
  }
};

Script Parse(const std::string& out) {
  Script s;
  const size_t at = out.find("# Megatron-LM launch");
  s.text = at == std::string::npos ? out : out.substr(at);
  std::istringstream lines(s.text);
  std::string cmd;
  bool in_cmd = false;
  for (std::string line; std::getline(lines, line);) {
    if (in_cmd) {
      cmd += " " + line;
    } else if (line.rfind("#", 0) == 0) {
      s.comments.push_back(line);
    } else if (line.rfind(": ", 0) == 0) {
      s.checks.push_back(line);
    } else if (line.rfind("torchrun ", 0) == 0) {
      cmd = line;
      in_cmd = true;
    }
    if (in_cmd && (line.empty() || line.back() != '\\')) break;
  }
  std::istringstream tokens(cmd);
  bool after = false;
  for (std::string t; tokens >> t;) {
    if (t == "\\") continue;
    if (!after) {
      if (t == "pretrain_gpt.py" || t == "pretrain_hybrid.py") after = true, s.script = t;
      else s.torchrun.push_back(t);
      continue;
    }
    if (t.rfind("--", 0) == 0) s.args.push_back({t, ""});
    else if (!s.args.empty()) s.args.back().second += (s.args.back().second.empty() ? "" : " ") + t;
    else s.args.push_back({"<value before any flag>", t});
  }
  for (const std::string& t : s.torchrun) {
    if (t.rfind("--nproc_per_node=", 0) == 0) s.nproc = std::stoi(t.substr(17));
    if (t.rfind("--nnodes=", 0) == 0) s.nnodes = std::stoi(t.substr(9));
  }
  return s;
}

// Megatron's list expression ("([0]*3+[1]*58)", "([0,1]*24)"), as Python evaluates it.
class PatternEval {
 public:
  explicit PatternEval(std::string s) : s_(std::move(s)) {}
  std::vector<int> Run() {
    std::vector<int> v = Expr();
    if (i_ != s_.size()) bad_ = true;
    return bad_ ? std::vector<int>{} : v;
  }

 private:
  std::vector<int> Expr() {
    std::vector<int> v = Term();
    while (!bad_ && i_ < s_.size() && s_[i_] == '+') {
      ++i_;
      std::vector<int> t = Term();
      v.insert(v.end(), t.begin(), t.end());
    }
    return v;
  }
  std::vector<int> Term() {
    std::vector<int> v = Atom();
    while (!bad_ && i_ < s_.size() && s_[i_] == '*') {
      ++i_;
      const int n = Int();
      std::vector<int> r;
      for (int k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = r;
    }
    return v;
  }
  std::vector<int> Atom() {
    std::vector<int> v;
    if (i_ < s_.size() && s_[i_] == '(') {
      ++i_;
      v = Expr();
      if (i_ < s_.size() && s_[i_] == ')') ++i_;
      else bad_ = true;
    } else if (i_ < s_.size() && s_[i_] == '[') {
      ++i_;
      while (!bad_ && i_ < s_.size() && s_[i_] != ']') {
        v.push_back(Int());
        if (i_ < s_.size() && s_[i_] == ',') ++i_;
      }
      if (i_ < s_.size()) ++i_;
      else bad_ = true;
    } else {
      bad_ = true;
    }
    return v;
  }
  int Int() {
    size_t j = i_;
    while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
    if (j == i_) { bad_ = true; return 0; }
    const int n = std::stoi(s_.substr(i_, j - i_));
    i_ = j;
    return n;
  }
  std::string s_;
  size_t i_ = 0;
  bool bad_ = false;
};

std::string Unquote(const std::string& v) {
  return v.size() >= 2 && v.front() == '\'' && v.back() == '\'' ? v.substr(1, v.size() - 2) : v;
}

// The checks every emitted command passes.
void ExpectRunnable(const Script& s, int world) {
  SCOPED_TRACE(s.text);
  ASSERT_FALSE(s.args.empty());
  // Flag names: Megatron-LM's, each once.
  std::set<std::string> seen;
  for (const auto& [flag, value] : s.args) {
    EXPECT_TRUE(MegatronFlags().count(flag)) << flag << " is not a Megatron-LM flag";
    EXPECT_TRUE(seen.insert(flag).second) << flag << " given twice";
  }
  // validate_args: --tp-comm-overlap only with sequence parallelism (which needs tp > 1).
  if (s.Has("--tp-comm-overlap")) {
    EXPECT_TRUE(s.Has("--sequence-parallel"));
    EXPECT_GT(std::stoi(s.Value("--tensor-model-parallel-size")), 1);
  }
  // torchrun starts the plan's world; Megatron divides it by tp x pp x cp.
  EXPECT_EQ(s.nproc * s.nnodes, world) << "nproc_per_node x nnodes";
  const int tp = std::stoi(s.Value("--tensor-model-parallel-size"));
  const int pp = std::stoi(s.Value("--pipeline-model-parallel-size"));
  const int cp = s.Has("--context-parallel-size") ? std::stoi(s.Value("--context-parallel-size")) : 1;
  EXPECT_EQ(world % (tp * pp * cp), 0);
  if (s.nnodes > 1) {  // braces: EXPECT_* expands to an if/else
    for (const char* t : {"--node_rank=${NODE_RANK}", "--master_addr=${MASTER_ADDR}"})
      EXPECT_NE(std::find(s.torchrun.begin(), s.torchrun.end(), t), s.torchrun.end()) << t;
  }
  // The placeholders: the ones every run needs, each named in the header and checked before
  // torchrun starts.
  for (const char* flag : {"--tokenizer-model", "--data-path", "--lr", "--min-lr"})
    EXPECT_EQ(s.Value(flag).rfind("${", 0), 0u) << flag << " " << s.Value(flag);
  const std::regex var(R"(\$\{([A-Z_]+)(:-[^}]*)?\})");
  std::string cmd;
  for (const std::string& t : s.torchrun) cmd += t + " ";
  for (const auto& [f, v] : s.args) cmd += f + " " + v + " ";
  for (auto it = std::sregex_iterator(cmd.begin(), cmd.end(), var); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    bool named = false, checked = false;
    for (const std::string& c : s.comments) named = named || c.rfind("#   " + name + " ", 0) == 0;
    for (const std::string& c : s.checks) checked = checked || c.find("${" + name + ":?") != std::string::npos;
    EXPECT_TRUE(named) << name << " is not explained in the header";
    if ((*it)[2].length() == 0) {  // braces: EXPECT_* expands to an if/else
      EXPECT_TRUE(checked) << name << " is not checked";
    }
  }
  // Value formats Megatron parses.
  if (s.Has("--moe-layer-freq")) {
    const std::vector<int> pattern = PatternEval(Unquote(s.Value("--moe-layer-freq"))).Run();
    EXPECT_EQ(int64_t(pattern.size()), std::stoll(s.Value("--num-layers")));
  }
  if (s.Has("--rotary-base")) {  // type=int
    EXPECT_EQ(s.Value("--rotary-base").find_first_not_of("0123456789"), std::string::npos);
  }
  EXPECT_FALSE(s.Has("--multi-latent-attention") && s.Has("--group-query-attention"));
}

Plan MakePlan(const std::string& model, const Layout& l, int gpus_per_node = 8, int nodes = 128) {
  auto m = LoadModelFile(ModelFile(model));
  EXPECT_TRUE(m.ok()) << m.status().message();
  Plan p;
  p.model = *m;
  p.layout = l;
  p.cluster_name = "dgx-h100";
  p.cluster_file = "dgx-h100";
  p.gpus_per_node = gpus_per_node;
  p.nodes = nodes;
  return p;
}

// ---- Through the binary.

TEST(MegatronCommand, Llama3_8bDense) {
  const CmdResult r = Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") +
                           " --gpus 8 --global-batch 128 --top 1 --refine 0 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.nproc, 8);
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.Value("--num-layers"), "32");
  EXPECT_EQ(s.Value("--hidden-size"), "4096");
  EXPECT_EQ(s.Value("--ffn-hidden-size"), "14336");
  EXPECT_EQ(s.Value("--num-query-groups"), "8");
  EXPECT_TRUE(s.Has("--group-query-attention"));
  EXPECT_EQ(s.Value("--position-embedding-type"), "rope");
  EXPECT_EQ(s.Value("--rotary-base"), "500000");  // Llama 3's rope_theta
  EXPECT_EQ(s.Value("--normalization"), "RMSNorm");
  for (const char* f : {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"})
    EXPECT_TRUE(s.Has(f)) << f;
  EXPECT_EQ(s.Value("--attention-dropout"), "0");
  EXPECT_EQ(s.Value("--hidden-dropout"), "0");
  EXPECT_EQ(s.Value("--global-batch-size"), "128");
  EXPECT_EQ(s.Value("--train-iters"), "${TRAIN_ITERS}");
  EXPECT_EQ(s.Value("--tokenizer-type"), "HuggingFaceTokenizer");
  EXPECT_FALSE(s.Has("--num-experts"));
  EXPECT_FALSE(s.Has("--expert-model-parallel-size"));
}

TEST(MegatronCommand, TrainItersFromTrainTokens) {
  const CmdResult r = Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") +
                           " --gpus 8 --global-batch 128 --top 1 --refine 0 --emit megatron "
                           "--train-tokens 1T");
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--train-iters"), "953675");  // ceil(1e12 / (128 x 8192))
  EXPECT_EQ(s.text.find("TRAIN_ITERS"), std::string::npos);
}

// --ddp-bucket-size: carried by the plan and emitted with --overlap-grad-reduce (Megatron
// ignores it without); a size that is not a positive parameter count is one line naming it.
TEST(MegatronCommand, DdpBucketSize) {
  const std::string base = "simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") + " --gpus 16 --tp 8 --global-batch 128 ";
  CmdResult r = Ptdp(base + "--ddp-bucket-size 20000000 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  Script s = Parse(r.out);
  ExpectRunnable(s, 16);
  EXPECT_TRUE(s.Has("--overlap-grad-reduce"));
  EXPECT_EQ(s.Value("--ddp-bucket-size"), "20000000");
  r = Ptdp(base + "--ddp-bucket-size 20000000 --overlap-grad-reduce off --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  s = Parse(r.out);
  EXPECT_FALSE(s.Has("--overlap-grad-reduce"));
  EXPECT_FALSE(s.Has("--ddp-bucket-size"));
  ExpectOneLineError(Ptdp(base + "--ddp-bucket-size 0"), "--ddp-bucket-size 0 must be a positive");
  ExpectOneLineError(Ptdp(base + "--ddp-bucket-size -5"), "--ddp-bucket-size -5 must be a positive");
}

// --grad-reduce-in-bf16: carried into the command beside --bf16; refused (one line) where
// Megatron would ignore it (fp16, fp32 weights).
TEST(MegatronCommand, GradReduceInBf16) {
  const std::string base = "simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") + " --gpus 16 --tp 8 --global-batch 128 ";
  CmdResult r = Ptdp(base + "--grad-reduce-in-bf16 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  Script s = Parse(r.out);
  ExpectRunnable(s, 16);
  EXPECT_TRUE(s.Has("--grad-reduce-in-bf16"));
  EXPECT_TRUE(s.Has("--bf16"));
  r = Ptdp(base + "--emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(Parse(r.out).Has("--grad-reduce-in-bf16"));
  ExpectOneLineError(Ptdp(base + "--grad-reduce-in-bf16 --precision fp16"),
                     "--grad-reduce-in-bf16 needs bf16 weights");
  ExpectOneLineError(Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                          ModelFile("llama3-8b") +
                          " --gpus 16 --global-batch 128 --grad-reduce-in-bf16 --precision fp16"),
                     "--grad-reduce-in-bf16 needs bf16 weights");
  ExpectOneLineError(Ptdp(base + "--grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32"),
                     "ask for bf16 and fp32 gradient buffers");
  // Nothing fits: the advice says what bf16 gradient buffers would make of the smallest (llama3-8b
  // at tp 2, micro-batch 2 on two H100s: 79.7 GiB of 76 usable, 71.9 with them, on 2026-12-06),
  // and is not repeated to a plan that has them already.
  const std::string tight = "plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                            ModelFile("llama3-8b") +
                            " --gpus 2 --tp 2 --global-batch 64 --top 1 --refine 0 "
                            "--cross-entropy-loss-fusion off ";  // TE's loss would make mb 2 fit
  // (the table of the smallest, then the error line)
  r = Ptdp(tight + "--micro-batch 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("ptdp: no legal layout fits in GPU memory: the smallest needs "),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; --grad-reduce-in-bf16 (Megatron's bf16 gradient buffers) would bring it "
                       "to "),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" GiB, which fits; "), std::string::npos) << r.out;
  // ... and the options Megatron leaves off the fastest layout they make fit (here CPU
  // offloading at tp 2, pp 1).
  EXPECT_NE(r.out.find("--cpu-offloading-num-layers "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" (options Megatron leaves off), tp2 pp1 dp1 mb2 ["), std::string::npos)
      << r.out;
  r = Ptdp(tight + "--micro-batch 4 --recompute full --grad-reduce-in-bf16");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.out.find("would bring it to"), std::string::npos) << r.out;
  // fp16's gradients are fp16 unless accumulated in fp32 (emitted).
  r = Ptdp(base + "--precision fp16 --accumulate-allreduce-grads-in-fp32 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  s = Parse(r.out);
  EXPECT_TRUE(s.Has("--fp16"));
  EXPECT_TRUE(s.Has("--accumulate-allreduce-grads-in-fp32"));
}

// --use-precision-aware-optimizer and its dtypes: simulate prints and carries them, the
// optimizer's memory falls (Llama 3 8B on 16 H100s, dp 2: 12 bytes a parameter over 2 ranks,
// 2 + 2 + 2 with bf16 moments), the command has Megatron's flags, plan turns the distributed
// optimizer on for them, and Megatron's refusals are one-line errors.
TEST(MegatronCommand, PrecisionAwareOptimizer) {
  const std::string base = "simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") + " --gpus 16 --tp 8 --global-batch 128 ";
  const std::string pa = "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                         "--exp-avg-sq-dtype bf16 --main-grads-dtype bf16 ";
  CmdResult plain = Ptdp(base + "--dist-opt on --json");
  CmdResult r = Ptdp(base + "--dist-opt on --json " + pa);
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(r.code, 0) << r.out;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(r.out);
  EXPECT_NEAR(b["memory_bytes"]["optimizer"].get<double>() / a["memory_bytes"]["optimizer"].get<double>(),
              6.0 / 12.0, 1e-9);
  EXPECT_NEAR(b["memory_bytes"]["grads"].get<double>() / a["memory_bytes"]["grads"].get<double>(), 0.5,
              1e-9);
  EXPECT_TRUE(b["layout"]["use_precision_aware_optimizer"].get<bool>());
  EXPECT_EQ(b["layout"]["exp_avg_dtype"].get<std::string>(), "bf16");
  EXPECT_EQ(b["layout"]["main_params_dtype"].get<std::string>(), "fp32");
  r = Ptdp(base + "--dist-opt on --emit megatron " + pa);
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 16);
  EXPECT_TRUE(s.Has("--use-precision-aware-optimizer"));
  EXPECT_EQ(s.Value("--exp-avg-dtype"), "bf16");
  EXPECT_EQ(s.Value("--exp-avg-sq-dtype"), "bf16");
  EXPECT_EQ(s.Value("--main-grads-dtype"), "bf16");
  EXPECT_FALSE(s.Has("--main-params-dtype"));  // fp32, Megatron's default
  // plan: the flag keeps the distributed optimizer on, as Megatron requires.
  const std::string plan = "plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") + " --gpus 16 --global-batch 128 --top 5 --json "
                           "--options-left-off off ";
  r = Ptdp(plan + pa);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json planned = nlohmann::json::parse(r.out);  // outlives the loop
  for (const auto& row : planned["plans"]) {
    EXPECT_TRUE(row["layout"]["distributed_optimizer"].get<bool>());
    EXPECT_TRUE(row["layout"]["use_precision_aware_optimizer"].get<bool>());
  }
  ExpectOneLineError(Ptdp(plan + pa + "--dist-opt off"), "needs the distributed optimizer");
  ExpectOneLineError(Ptdp(base + pa), "needs the distributed optimizer (--dist-opt on)");
  ExpectOneLineError(Ptdp(base + "--dist-opt on --exp-avg-dtype bf16"),
                     "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer");
  ExpectOneLineError(Ptdp(base + "--dist-opt on --use-precision-aware-optimizer --main-params-dtype bf16"),
                     "--main-params-dtype 'bf16' is not one of: fp32, fp16");
  ExpectOneLineError(Ptdp(base + "--dist-opt on --precision fp16 " + pa), "needs bf16 weights");
  ExpectOneLineError(Ptdp(plan + "--precision fp16 " + pa), "needs bf16 weights");
}

TEST(MegatronCommand, Llama3_70bWithSequenceParallelAndTpCommOverlap) {
  const std::string base = "simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-70b") + " --gpus 64 --tp 4 --pp 4 --global-batch 128 ";
  const CmdResult r = Ptdp(base + "--sp on --tp-comm-overlap on --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 64);
  EXPECT_TRUE(s.Has("--sequence-parallel"));
  EXPECT_TRUE(s.Has("--tp-comm-overlap"));
  EXPECT_EQ(s.Value("--tensor-model-parallel-size"), "4");
  EXPECT_EQ(s.nproc, 8);
  EXPECT_EQ(s.nnodes, 8);
  EXPECT_NE(s.text.find("export CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos);
  // Without SP the layout is refused in a line, as Megatron-LM refuses it.
  ExpectOneLineError(Ptdp(base + "--tp-comm-overlap on"), "--tp-comm-overlap needs --sequence-parallel");
  ExpectOneLineError(Ptdp(base + "--sp off --tp-comm-overlap on --emit megatron"),
                     "--tp-comm-overlap needs --sequence-parallel");
}

TEST(MegatronCommand, PlanNeverEmitsTpCommOverlapWithoutSp) {
  const CmdResult r = Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-70b") +
                           " --gpus 64 --global-batch 128 --tp 4,8 --tp-comm-overlap on --top 1 "
                           "--refine 0 --json --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const Script s = Parse(j["megatron_command"].get<std::string>());
  ExpectRunnable(s, 64);
  EXPECT_EQ(s.Has("--tp-comm-overlap"), j["layout"]["tp_comm_overlap"].get<bool>());
  EXPECT_EQ(s.Has("--sequence-parallel"), j["layout"]["sequence_parallel"].get<bool>());
}

TEST(MegatronCommand, ContextParallel) {
  const CmdResult r = Ptdp("simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") +
                           " --gpus 16 --tp 2 --cp 4 --sp on --global-batch 64 --emit megatron --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const Script s = Parse(j["megatron_command"].get<std::string>());
  ExpectRunnable(s, 16);
  EXPECT_EQ(s.Value("--context-parallel-size"), "4");
  EXPECT_EQ(s.Value("--tensor-model-parallel-size"), "2");
  EXPECT_EQ(std::stoi(s.Value("--seq-length")) % (2 * 4), 0);  // validate_args
  EXPECT_EQ(s.nproc, 8);
  EXPECT_EQ(s.nnodes, 2);
}

// Llama 3.1 405B over pp 16 with the embedding and the loss each in a layer's slot (Meta's
// split: 8 slots per stage).
TEST(MegatronCommand, UnevenSplitOfLlama3_405b) {
  const CmdResult r = Ptdp("simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-405b") +
                           " --nodes 128 --tp 8 --pp 16 --sp on --recompute full --global-batch 512 "
                           "--account-for-embedding-in-pipeline-split "
                           "--account-for-loss-in-pipeline-split --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 1024);
  EXPECT_TRUE(s.Has("--account-for-embedding-in-pipeline-split"));
  EXPECT_TRUE(s.Has("--account-for-loss-in-pipeline-split"));
  EXPECT_EQ(s.Value("--pipeline-model-parallel-size"), "16");
  EXPECT_EQ(s.Value("--num-layers"), "126");
  EXPECT_EQ((126 + 2) % 16, 0);  // validate_args' check of the accounted split
  EXPECT_EQ(s.Value("--recompute-granularity"), "full");
  EXPECT_EQ(s.nproc, 8);
  EXPECT_EQ(s.nnodes, 128);
  // The same with 4 virtual stages per rank names them the way uneven splits need.
  const CmdResult v = Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-405b") +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 --vp 4 --refine 0 --top 1 "
                           "--account-for-embedding-in-pipeline-split "
                           "--account-for-loss-in-pipeline-split --emit megatron");
  ASSERT_EQ(v.code, 0) << v.out;
  const Script sv = Parse(v.out);
  ExpectRunnable(sv, 16384);
  EXPECT_EQ(sv.Value("--num-virtual-stages-per-pipeline-rank"), "4");
  EXPECT_FALSE(sv.Has("--num-layers-per-virtual-pipeline-stage"));
}

// 12 GPUs on 8-GPU nodes: torchrun starts 12 ranks in equal nodes, never 16.
TEST(MegatronCommand, TwelveGpusOnEightGpuNodes) {
  const CmdResult r = Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("llama3-8b") +
                           " --gpus 12 --global-batch 96 --top 1 --refine 0 --json --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const Script s = Parse(j["megatron_command"].get<std::string>());
  ExpectRunnable(s, 12);
  EXPECT_LE(s.nproc, 8);
  EXPECT_GT(s.nnodes, 1);
  EXPECT_EQ(s.nproc % j["layout"]["tp"].get<int>(), 0) << "TP groups inside a node";
}

TEST(MegatronCommand, TorchrunGridRule) {
  auto grid = [](int world, int tp, int g, int nodes, int npd = 1) {
    const TorchrunGrid t = ChooseTorchrunGrid(world, tp, g, nodes, npd);
    return std::to_string(t.nproc_per_node) + "x" + std::to_string(t.nnodes) +
           (t.tp_crosses_nvlink ? " tp-crosses" : "") + (t.too_few_nodes ? " too-few-nodes" : "");
  };
  EXPECT_EQ(grid(8, 8, 8, 1), "8x1");
  EXPECT_EQ(grid(4, 2, 8, 1), "4x1");
  EXPECT_EQ(grid(1024, 8, 8, 128), "8x128");
  EXPECT_EQ(grid(12, 1, 8, 128), "6x2");
  EXPECT_EQ(grid(12, 2, 8, 128), "6x2");
  EXPECT_EQ(grid(12, 4, 8, 128), "4x3");   // 6 per node would split a TP group of 4
  EXPECT_EQ(grid(12, 4, 8, 2), "6x2 tp-crosses");  // only 2 nodes: TP crosses them
  EXPECT_EQ(grid(64, 8, 4, 18, 18), "4x16");  // NVL72 trays: TP 8 over 2 trays of one rack
  EXPECT_EQ(grid(13, 1, 8, 2), "1x13 too-few-nodes");
}

TEST(MegatronCommand, EmitRefusesUnknownValues) {
  const std::string plan = "plan --cluster " + ClusterFile("dgx-a100") + " --model " +
                           ModelFile("gpt3-175b") + " --global-batch 1536 --top 1 --emit bogus";
  const std::string sim = "simulate --cluster " + ClusterFile("dgx-a100") + " --model " +
                          ModelFile("gpt3-175b") + " --global-batch 1536 --tp 8 --pp 16 --emit bogus";
  for (const std::string& cmd : {plan, sim}) {
    const CmdResult r = Ptdp(cmd);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("'bogus' is not a launcher ptdp writes; expected: megatron"),
              std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "more than one line: " << r.out;
  }
}

TEST(MegatronCommand, JsonCarriesTheCommandAsOneField) {
  for (const std::string& cmd :
       {"plan --cluster " + ClusterFile("dgx-a100") + " --model " + ModelFile("gpt3-175b") +
            " --global-batch 1536 --top 1 --refine 0 --emit megatron --json",
        "simulate --cluster " + ClusterFile("dgx-a100") + " --model " + ModelFile("gpt3-175b") +
            " --global-batch 1536 --tp 8 --pp 16 --emit megatron --json"}) {
    const CmdResult r = ptdp::testing::Shell(kBin + " " + cmd, /*with_stderr=*/false);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);  // one document, nothing after it
    const Script s = Parse(j["megatron_command"].get<std::string>());
    ExpectRunnable(s, 1024);
    EXPECT_EQ(s.Value("--position-embedding-type"), "learned_absolute");  // GPT-3
    EXPECT_FALSE(s.Has("--attention-dropout"));  // GPT-3 trains with Megatron's dropout 0.1
  }
}

// Mixtral through simulate's expert flags: every layer is MoE (no --moe-layer-freq), experts
// over ep 4 with etp = tp 2, and the layout's JSON and plan.yaml carry ep and etp.
TEST(MegatronCommand, MixtralWithExpertParallelFlags) {
  const CmdResult r = Ptdp("simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("mixtral-8x7b") +
                           " --gpus 8 --tp 2 --sp on --ep 4 --global-batch 64 --emit megatron --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"]["ep"].get<int>(), 4);
  EXPECT_EQ(j["layout"]["etp"].get<int>(), 2);
  const Script s = Parse(j["megatron_command"].get<std::string>());
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--num-experts"), "8");
  EXPECT_EQ(s.Value("--moe-router-topk"), "2");
  EXPECT_EQ(s.Value("--moe-ffn-hidden-size"), "14336");
  EXPECT_EQ(s.Value("--expert-model-parallel-size"), "4");
  EXPECT_EQ(s.Value("--expert-tensor-parallel-size"), "2");
  EXPECT_EQ(s.Value("--moe-token-dispatcher-type"), "alltoall");
  EXPECT_EQ(s.Value("--moe-router-load-balancing-type"), "aux_loss");
  EXPECT_TRUE(s.Has("--moe-grouped-gemm"));
  EXPECT_FALSE(s.Has("--moe-layer-freq"));
  EXPECT_FALSE(s.Has("--moe-shared-expert-intermediate-size"));
  EXPECT_FALSE(s.Has("--moe-router-score-function"));  // softmax, Megatron's default
  EXPECT_EQ(s.Value("--rotary-base"), "1000000");
  // The long names, and etp apart from tp.
  const CmdResult e = Ptdp("simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("mixtral-8x7b") +
                           " --gpus 8 --tp 2 --sp on --expert-model-parallel-size 8 "
                           "--expert-tensor-parallel-size 1 --global-batch 64 --emit megatron --json");
  ASSERT_EQ(e.code, 0) << e.out;
  const Script se = Parse(nlohmann::json::parse(e.out)["megatron_command"].get<std::string>());
  EXPECT_EQ(se.Value("--expert-model-parallel-size"), "8");
  EXPECT_EQ(se.Value("--expert-tensor-parallel-size"), "1");
  // Megatron's rules, in a line each.
  const std::string base = "simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                           ModelFile("mixtral-8x7b") + " --gpus 8 --tp 2 --global-batch 64 ";
  ExpectOneLineError(Ptdp(base + "--sp on --ep 3"), "num_experts 8 % ep 3");
  ExpectOneLineError(Ptdp(base + "--ep 4"), "a MoE model with tp 2 needs sequence parallelism");
  ExpectOneLineError(Ptdp(base + "--ep 1"), "a MoE model with tp 2");  // ep 1 too (MoELayer)
  ExpectOneLineError(Ptdp(base + "--sp on --ep 4,8"), "takes one value here");
  ExpectOneLineError(Ptdp(base + "--sp on --ep 0"), "--expert-model-parallel-size 0 must be in 1..");
  ExpectOneLineError(Ptdp("simulate --cluster " + ClusterFile("dgx-h100") + " --model " +
                          ModelFile("llama3-8b") + " --gpus 8 --global-batch 64 --ep 2"),
                     "--expert-model-parallel-size: llama3-8b has no experts");
  ExpectOneLineError(Ptdp("plan --cluster " + ClusterFile("dgx-h100") + " --model " +
                          ModelFile("llama3-8b") + " --gpus 8 --global-batch 64 --etp 2"),
                     "--expert-tensor-parallel-size: llama3-8b has no experts");
}

// ---- Plans built directly (the planner does not search expert parallelism yet).

Layout Lay(int tp, int pp, int dp, int64_t global_batch) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.global_batch = global_batch;
  l.distributed_optimizer = true;
  return l;
}

// DeepSeek-V3: 3 dense layers then 58 MoE, 256 experts over ep 64, MLA with a q latent, one MTP
// layer on the last stage, and Megatron's layout string over pp 16.
TEST(MegatronCommand, DeepSeekV3) {
  Layout l = Lay(1, 16, 64, 4096);
  l.ep = 64;
  l.etp = 1;
  auto pl = ParsePipelineLayout("Et*3|(t*4|)*14t*2mL");
  ASSERT_TRUE(pl.ok()) << pl.status().message();
  l.pipeline_layout = std::make_shared<const PipelineLayout>(*pl);
  const Plan plan = MakePlan("deepseek-v3", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 1024);
  EXPECT_EQ(s.Value("--num-experts"), "256");
  EXPECT_EQ(s.Value("--moe-router-topk"), "8");
  EXPECT_EQ(s.Value("--moe-ffn-hidden-size"), "2048");
  EXPECT_EQ(s.Value("--ffn-hidden-size"), "18432");  // the dense layers
  EXPECT_EQ(s.Value("--moe-shared-expert-intermediate-size"), "2048");
  EXPECT_EQ(s.Value("--moe-layer-freq"), "'([0]*3+[1]*58)'");
  EXPECT_EQ(s.Value("--moe-router-score-function"), "sigmoid");
  EXPECT_EQ(s.Value("--expert-model-parallel-size"), "64");
  EXPECT_EQ(s.Value("--expert-tensor-parallel-size"), "1");
  EXPECT_TRUE(s.Has("--multi-latent-attention"));
  EXPECT_EQ(s.Value("--q-lora-rank"), "1536");
  EXPECT_EQ(s.Value("--kv-lora-rank"), "512");
  EXPECT_EQ(s.Value("--qk-head-dim"), "128");
  EXPECT_EQ(s.Value("--qk-pos-emb-head-dim"), "64");
  EXPECT_EQ(s.Value("--v-head-dim"), "128");
  EXPECT_EQ(s.Value("--rope-type"), "rope");
  EXPECT_TRUE(s.Has("--no-rope-fusion"));  // MLA fuses only YaRN RoPE
  EXPECT_TRUE(s.Has("--qk-layernorm"));
  EXPECT_EQ(s.Value("--mtp-num-layers"), "1");
  EXPECT_EQ(s.Value("--pipeline-model-parallel-layout"), "'Et*3|(t*4|)*14t*2mL'");
  EXPECT_FALSE(s.Has("--group-query-attention"));
  EXPECT_FALSE(s.Has("--num-layers-per-virtual-pipeline-stage"));
  const std::vector<int> pattern =
      PatternEval(Unquote(s.Value("--moe-layer-freq"))).Run();
  for (int i = 0; i < int(pattern.size()); ++i)
    EXPECT_EQ(pattern[i] == 1, plan.model.is_moe_layer(i)) << "layer " << i;
}

// Nemotron 3 Nano, a hybrid model: pretrain_hybrid.py with its pattern and Mamba sizes (as in
// Megatron-LM's examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.sh),
// no --moe-layer-freq (the pattern places the E layers), no position embedding.
TEST(MegatronCommand, Nemotron3NanoHybrid) {
  Layout l = Lay(1, 1, 8, 512);
  l.ep = 8;
  l.micro_batch = 2;
  const Plan plan = MakePlan("nemotron3-nano", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.script, "pretrain_hybrid.py");
  EXPECT_NE(s.text.find("Megatron-LM checkout (pretrain_hybrid.py)"), std::string::npos);
  EXPECT_EQ(s.Value("--hybrid-layer-pattern"),
            "'MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME'");
  EXPECT_EQ(s.Value("--num-layers"), "52");  // the pattern's length, as arguments.py derives
  EXPECT_EQ(s.Value("--mamba-num-heads"), "64");
  EXPECT_EQ(s.Value("--mamba-head-dim"), "64");
  EXPECT_EQ(s.Value("--mamba-num-groups"), "8");
  EXPECT_EQ(s.Value("--mamba-state-dim"), "128");
  EXPECT_EQ(s.Value("--position-embedding-type"), "none");
  EXPECT_EQ(s.Value("--num-experts"), "128");
  EXPECT_EQ(s.Value("--moe-router-topk"), "6");
  EXPECT_EQ(s.Value("--moe-shared-expert-intermediate-size"), "3712");
  EXPECT_EQ(s.Value("--num-query-groups"), "2");
  EXPECT_EQ(s.Value("--kv-channels"), "128");
  EXPECT_TRUE(s.Has("--squared-relu"));
  EXPECT_FALSE(s.Has("--moe-layer-freq"));
  EXPECT_FALSE(s.Has("--rotary-base"));
  // A transformer's command stays pretrain_gpt.py.
  EXPECT_EQ(Parse(MegatronCommand(MakePlan("llama3-8b", Lay(1, 1, 8, 128)))).script,
            "pretrain_gpt.py");
}

// --recompute-modules: named modules instead of --recompute-activations; moe_act and layernorm
// with fp8 need current scaling (Megatron refuses them with the default delayed recipe).
TEST(MegatronCommand, RecomputeModules) {
  Layout l = Lay(1, 1, 8, 512);
  l.ep = 8;
  l.recompute = Recompute::kSelective;
  l.recompute_modules = kRecomputeMoeAct | kRecomputeLayernorm;
  l.precision = Precision::kFp8;
  Plan plan = MakePlan("nemotron3-nano", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--recompute-granularity"), "selective");
  EXPECT_EQ(s.Value("--recompute-modules"), "layernorm moe_act");
  EXPECT_FALSE(s.Has("--recompute-activations"));
  EXPECT_EQ(s.Value("--fp8-recipe"), "tensorwise");
  // core_attn alone is --recompute-activations, fp8 keeps Megatron's default recipe.
  plan.layout.recompute_modules = 0;
  s = Parse(MegatronCommand(plan));
  EXPECT_TRUE(s.Has("--recompute-activations"));
  EXPECT_FALSE(s.Has("--recompute-modules"));
  EXPECT_FALSE(s.Has("--fp8-recipe"));
}

// Megatron-FSDP ZeRO-3 with CPU activation offloading (Megatron-Bridge's Llama 3 70B recipe on
// GB200: FSDP over 64, 40 layers offloaded): the strategy and the offloading flags.
TEST(MegatronCommand, FsdpZero3WithCpuOffloading) {
  Layout l = Lay(1, 1, 64, 256);
  l.distributed_optimizer = l.shard_gradients = l.shard_params = true;
  l.cpu_offload_layers = 40;
  l.micro_batch = 2;
  const Plan plan = MakePlan("llama3-70b", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 64);
  EXPECT_TRUE(s.Has("--use-megatron-fsdp"));
  EXPECT_EQ(s.Value("--data-parallel-sharding-strategy"), "optim_grads_params");
  EXPECT_EQ(s.Value("--ckpt-format"), "fsdp_dtensor");
  EXPECT_EQ(s.Value("--cpu-offloading-num-layers"), "40");  // sets cpu_offloading (arguments.py)
}

TEST(MegatronCommand, Llama4MaverickInterleavesMoeLayers) {
  Layout l = Lay(4, 4, 8, 1024);
  l.sequence_parallel = true;
  l.ep = 8;
  const Plan plan = MakePlan("llama4-maverick", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 128);
  EXPECT_EQ(s.Value("--moe-layer-freq"), "'([0,1]*24)'");
  EXPECT_EQ(s.Value("--moe-router-topk"), "1");
  EXPECT_EQ(s.Value("--kv-channels"), "128");
  EXPECT_EQ(s.Value("--expert-tensor-parallel-size"), "4");  // = tp
  const std::vector<int> pattern = PatternEval(Unquote(s.Value("--moe-layer-freq"))).Run();
  ASSERT_EQ(pattern.size(), 48u);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(pattern[i] == 1, plan.model.is_moe_layer(i)) << i;
}

// Grok-1: capacity routing (factor 1, padded to capacity), GeGLU (no exact flag: quick GeGLU and
// a warning), an explicit head size.
TEST(MegatronCommand, Grok1CapacityRouting) {
  Layout l = Lay(8, 8, 1, 64);
  l.sequence_parallel = true;
  l.ep = 8;
  l.etp = 1;
  const Plan plan = MakePlan("grok-1", l);
  ASSERT_EQ(CheckLayout(plan.model, l), Rejection::kOk)
      << ExplainRejection(CheckLayout(plan.model, l), plan.model, l);
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 64);
  EXPECT_EQ(s.Value("--moe-expert-capacity-factor"), "1");
  EXPECT_TRUE(s.Has("--moe-pad-expert-input-to-capacity"));
  EXPECT_EQ(s.Value("--moe-router-load-balancing-type"), "aux_loss");  // capacity needs it
  EXPECT_TRUE(s.Has("--quick-geglu"));
  EXPECT_FALSE(s.Has("--swiglu"));
  EXPECT_NE(s.text.find("# WARNING: GeGLU"), std::string::npos);
  EXPECT_EQ(s.Value("--kv-channels"), "128");
  EXPECT_FALSE(s.Has("--untie-embeddings-and-output-weights"));
}

TEST(MegatronCommand, ForceBalancedRouting) {
  Plan plan = MakePlan("mixtral-8x7b", Lay(1, 1, 8, 64));
  plan.layout.ep = 8;
  plan.model.moe_routing = MoeRouting::kBalanced;
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_TRUE(s.Has("--moe-router-force-load-balancing"));
  EXPECT_FALSE(s.Has("--moe-expert-capacity-factor"));
}

// Sliding windows, parallel attention + MLP and ALiBi: the flag where Megatron has one, a
// marked warning where it has none.
TEST(MegatronCommand, WindowsParallelBlocksAndAlibi) {
  Plan plan = MakePlan("llama3-8b", Lay(1, 1, 8, 64));
  plan.model.sliding_window = 4096;
  plan.model.global_attention_every = 6;
  plan.model.parallel_attn_mlp = true;
  plan.model.rotary_percent = 0.25;
  Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--window-size"), "4095,0");
  EXPECT_EQ(s.Value("--window-attn-skip-freq"), "6");
  EXPECT_EQ(s.Value("--rotary-percent"), "0.25");
  EXPECT_NE(s.text.find("# WARNING: this model adds attention and MLP in parallel"),
            std::string::npos);
  const Plan bloom = MakePlan("bloom-176b", Lay(8, 1, 1, 64));
  s = Parse(MegatronCommand(bloom));
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--position-embedding-type"), "none");
  EXPECT_NE(s.text.find("# WARNING: ALiBi"), std::string::npos);
}

// Squared ReLU with biases: the GeLU bias fusion (on with biases) takes gelu, swiglu or
// quick_geglu only, so the command turns it off; without biases Megatron turns it off itself.
TEST(MegatronCommand, SquaredReluWithBiases) {
  Plan plan = MakePlan("nemotron4-15b", Lay(4, 1, 2, 64));
  plan.layout.sequence_parallel = true;
  Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_TRUE(s.Has("--squared-relu"));
  EXPECT_FALSE(s.Has("--no-bias-gelu-fusion"));
  plan.model.bias = true;
  s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_TRUE(s.Has("--no-bias-gelu-fusion"));
  EXPECT_FALSE(s.Has("--disable-bias-linear"));
}

// Megatron-FSDP: validate_args wants its checkpoint format and refuses
// CUDA_DEVICE_MAX_CONNECTIONS=1.
TEST(MegatronCommand, MegatronFsdp) {
  Plan plan = MakePlan("llama3-70b", Lay(8, 1, 8, 64));
  plan.layout.sequence_parallel = true;
  plan.layout.shard_gradients = true;
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 64);
  EXPECT_EQ(s.Value("--data-parallel-sharding-strategy"), "optim_grads");
  EXPECT_EQ(s.Value("--ckpt-format"), "fsdp_dtensor");
  EXPECT_TRUE(s.Has("--use-megatron-fsdp"));
  EXPECT_TRUE(s.Has("--use-distributed-optimizer"));
  EXPECT_NE(s.text.find("\nunset CUDA_DEVICE_MAX_CONNECTIONS"), std::string::npos);
  EXPECT_EQ(s.text.find("export CUDA_DEVICE_MAX_CONNECTIONS"), std::string::npos);
}

// A layout with TP overlap but no SP (CheckLayout refuses it; the command would not run): the
// flag is left out with a warning rather than emitted.
TEST(MegatronCommand, NeverTpCommOverlapWithoutSp) {
  Plan plan = MakePlan("llama3-8b", Lay(8, 1, 1, 64));
  plan.layout.tp_comm_overlap = true;
  const Script s = Parse(MegatronCommand(plan));
  ExpectRunnable(s, 8);
  EXPECT_FALSE(s.Has("--tp-comm-overlap"));
  EXPECT_NE(s.text.find("# WARNING: the plan asks for TP communication overlap"), std::string::npos);
}

// Every shipped model emits only Megatron-LM flags.
TEST(MegatronCommand, EveryShippedModel) {
  for (const char* name :
       {"bloom-176b", "deepseek-v3", "gpt-tiny", "gpt2-medium", "gpt3-175b", "grok-1", "llama2-70b",
        "llama3-405b", "llama4-maverick", "megatron-1t", "mixtral-8x22b", "mixtral-8x7b",
        "nemotron4-15b", "nemotron4-340b"}) {
    SCOPED_TRACE(name);
    const Plan plan = MakePlan(name, Lay(1, 1, 1, 8));
    ExpectRunnable(Parse(MegatronCommand(plan)), 1);
  }
}

// plan.yaml carries ep and etp; a file without them (older ptdp) loads with ep 1, etp = tp.
TEST(MegatronCommand, PlanFileCarriesExpertParallelism) {
  Layout l = Lay(2, 1, 4, 64);
  l.sequence_parallel = true;
  l.ep = 4;
  l.etp = 1;
  Plan plan = MakePlan("mixtral-8x7b", l, 8, 1);
  const std::string yaml = PlanToYaml(plan);
  EXPECT_NE(yaml.find("  ep: 4"), std::string::npos) << yaml;
  auto back = PlanFromYamlText(yaml, "moe.plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layout.ep, 4);
  EXPECT_EQ(back->layout.etp, 1);
  const std::string dir = ptdp::testing::FreshDir("megatron-plan");
  const std::string file = dir + "/moe.plan.yaml";
  plan.cluster_file = ClusterFile("dgx-h100");
  ASSERT_TRUE(WritePlanFile(plan, file).ok());
  const CmdResult r = Ptdp("simulate " + file + " --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const Script s = Parse(r.out);
  ExpectRunnable(s, 8);
  EXPECT_EQ(s.Value("--expert-model-parallel-size"), "4");
  EXPECT_EQ(s.Value("--expert-tensor-parallel-size"), "1");
  // Without the keys: ep 1, etp = tp.
  std::string old = yaml;
  for (const char* key : {"  ep: ", "  etp: "}) {
    const size_t at = old.find(key);
    ASSERT_NE(at, std::string::npos);
    old.erase(at, old.find('\n', at) + 1 - at);
  }
  auto older = PlanFromYamlText(old, "older.plan.yaml");
  ASSERT_TRUE(older.ok()) << older.status().message();
  EXPECT_EQ(older->layout.ep, 1);
  EXPECT_EQ(older->layout.expert_tp(), 2);
  // Checked on reading: 8 experts do not split over ep 3.
  std::string bad = yaml;
  bad.replace(bad.find("  ep: 4"), 7, "  ep: 3");
  auto refused = PlanFromYamlText(bad, "bad.plan.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("num_experts 8 % ep 3"), std::string::npos)
      << refused.status().message();
  // Dense plans stay as they were: no expert keys.
  EXPECT_EQ(PlanToYaml(MakePlan("llama3-8b", Lay(1, 1, 8, 64))).find("ep:"), std::string::npos);
}

}  // namespace
}  // namespace ptdp::cli
