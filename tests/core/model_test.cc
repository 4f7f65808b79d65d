// ModelSpec: every shipped model YAML loads, parameter counts match published figures and
// Narayanan eq. 2, bad YAML is reported with file, line and key, and Hugging Face import works.
// Letters: L layers, h hidden, V vocabulary, s sequence, f ffn hidden.
#include "core/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/limits.h"
#include "tests/core/test_util.h"

namespace ptdp {
namespace {

using ::ptdp::testing_util::SourcePath;
using ::ptdp::testing_util::WriteTemp;
using ::testing::HasSubstr;

ModelSpec MustLoad(const std::string& rel) {
  Result<ModelSpec> r = LoadModelFile(SourcePath(rel));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : ModelSpec{};
}

// Narayanan et al. 2021 eq. 2, multiplied out so that it is exact in integers:
// P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)) = 12 L h^2 + 13 L h + (V + s) h.
int64_t NarayananEq2(const ModelSpec& m) {
  const int64_t L = m.layers, h = m.hidden;
  return 12 * L * h * h + 13 * L * h + (m.vocab + m.seq_len) * h;
}

// ---------------------------------------------------------------------------------------------
// Shipped configs.

TEST(ModelConfigsTest, EveryShippedModelLoadsAndValidates) {
  namespace fs = std::filesystem;
  const fs::path dir = SourcePath("configs/models");
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    Result<ModelSpec> r = LoadModelFile(entry.path().string());
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(ValidateModel(*r, entry.path().string()).ok());
    // The name key matches the file name, so tables and files agree.
    EXPECT_EQ(r->name, entry.path().stem().string());
    names.push_back(r->name);
  }
  // The series the planner, calibration data and demos rely on.
  for (const char* expected :
       {"gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b",
        "gpt3-175b", "megatron-1.7b", "megatron-3.6b", "megatron-7.5b", "megatron-18b",
        "megatron-39b", "megatron-76b", "megatron-145b", "megatron-310b", "megatron-530b",
        "megatron-1t", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
        "llama3-405b", "gpt-tiny", "nemotron4-15b", "nemotron4-340b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
}

TEST(ModelConfigsTest, Gpt3_175bShapeAndCount) {
  const ModelSpec m = MustLoad("configs/models/gpt3-175b.yaml");
  EXPECT_EQ(m.layers, 96);
  EXPECT_EQ(m.hidden, 12288);
  EXPECT_EQ(m.heads, 96);
  EXPECT_EQ(m.kv_heads, 96);       // default: multi-head attention
  EXPECT_EQ(m.ffn_hidden, 49152);  // 4h
  EXPECT_EQ(m.seq_len, 2048);
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.head_dim(), 128);
  // Brown et al. 2020: 175.0B. 12*96*12288^2 = 173.9e9 dominates; total 174.6e9 (-0.23%).
  EXPECT_NEAR(static_cast<double>(m.total_params()), 175e9, 0.01 * 175e9);
}

// total_params() counts the final LayerNorm (gamma + beta = 2h), which eq. 2 leaves out;
// everything else is the same. GPT-2 124M checks the same convention against HF below.
TEST(ModelConfigsTest, TotalParamsIsNarayananEq2PlusFinalNorm) {
  for (const char* rel : {"configs/models/gpt3-175b.yaml", "configs/models/megatron-1t.yaml",
                          "configs/models/megatron-1.7b.yaml", "configs/models/gpt-tiny.yaml"}) {
    SCOPED_TRACE(rel);
    const ModelSpec m = MustLoad(rel);
    EXPECT_EQ(m.total_params(), NarayananEq2(m) + 2 * m.hidden);
  }
  // Hand check for the 1T model: 12*128*25600^2 = 1,006,632,960,000; 13*128*25600 =
  // 42,598,400; (51200 + 2048)*25600 = 1,363,148,800; + 2*25600 = 1,008,038,758,400.
  EXPECT_EQ(MustLoad("configs/models/megatron-1t.yaml").total_params(), 1008038758400);
}

TEST(ModelConfigsTest, PublishedParameterCounts) {
  struct Case {
    const char* file;
    double published;
    double tolerance;  // relative
  };
  const Case cases[] = {
      {"gpt3-175b", 175e9, 0.01},
      {"llama2-7b", 6.74e9, 0.01},     // HF: 6,738,415,616
      {"llama2-13b", 13.0e9, 0.01},    // HF: 13,015,864,320
      {"llama2-70b", 69.0e9, 0.01},    // HF: 68,976,648,192 (marketed as 70B)
      {"llama3-8b", 8.03e9, 0.01},     // HF: 8,030,261,248
      {"llama3-70b", 70.6e9, 0.01},    // HF: 70,553,706,496
      {"llama3-405b", 405.9e9, 0.015}, // HF: 405,853,388,800
      {"megatron-1.7b", 1.7e9, 0.03},  // Narayanan Table 1 rounds to 0.1B
      {"megatron-18b", 18.4e9, 0.01},
      {"megatron-145b", 145.6e9, 0.01},
      {"megatron-530b", 529.6e9, 0.01},
      {"megatron-1t", 1008.0e9, 0.01},
      {"nemotron4-15b", 15.7e9, 0.01},  // 3.2B embedding + 12.5B non-embedding
      {"nemotron4-340b", 341.0e9, 0.01}, // 9.4B embedding + 331.6B non-embedding
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const ModelSpec m = MustLoad(std::string("configs/models/") + c.file + ".yaml");
    EXPECT_NEAR(static_cast<double>(m.total_params()), c.published, c.tolerance * c.published);
  }
}

TEST(ModelConfigsTest, Llama2_7bCountIsExact) {
  // Per layer: attention 4 h^2 = 67,108,864; SwiGLU 3 h f = 3*4096*11008 = 135,266,304;
  // two RMSNorms 2h = 8,192 -> 202,383,360. x32 = 6,476,267,520; embeddings untied
  // 2*32000*4096 = 262,144,000; final norm 4,096. Sum 6,738,415,616 (the HF figure).
  const ModelSpec m = MustLoad("configs/models/llama2-7b.yaml");
  EXPECT_EQ(m.params_per_layer(), 202383360);
  EXPECT_EQ(m.total_params(), 6738415616);
}

TEST(ModelConfigsTest, GqaShapes) {
  const ModelSpec l70 = MustLoad("configs/models/llama2-70b.yaml");
  EXPECT_EQ(l70.kv_heads, 8);
  EXPECT_EQ(l70.ffn_hidden, 28672);
  // Attention with GQA: Q and O are h^2 each, K and V are h * (8 * 128) each:
  // 2*8192^2 + 2*8192*1024 = 150,994,944; MLP 3*8192*28672 = 704,643,072.
  EXPECT_EQ(l70.linear_params_per_layer(), 150994944 + 704643072);
  const ModelSpec l405 = MustLoad("configs/models/llama3-405b.yaml");
  EXPECT_EQ(l405.layers, 126);
  EXPECT_EQ(l405.kv_heads, 8);
  EXPECT_EQ(l405.ffn_hidden, 53248);
  EXPECT_EQ(l405.vocab, 128256);
  EXPECT_EQ(l405.seq_len, 8192);
}

TEST(ModelConfigsTest, GptTinyFitsTheCpuRuntime) {
  const ModelSpec m = MustLoad("configs/models/gpt-tiny.yaml");
  EXPECT_EQ(m.layers, 8);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.seq_len, 64);
  EXPECT_EQ(m.vocab, 256);
  EXPECT_EQ(m.layers % 4, 0);        // pp 4
  EXPECT_EQ((m.layers / 4) % 2, 0);  // with 2 virtual stages
  // 8 * (12*64^2 + 13*64) + (256 + 64)*64 + 2*64 = 399,872 + 20,480 + 128.
  EXPECT_EQ(m.total_params(), 420480);
}

TEST(ModelSpecTest, PaddedVocab) {
  ModelSpec m;
  m.vocab = 50257;
  EXPECT_EQ(m.padded_vocab(1), 50304);  // 393 * 128
  EXPECT_EQ(m.padded_vocab(8), 51200);  // multiple of 1024: 50 * 1024
  EXPECT_EQ(m.padded_vocab(2), 50432);  // 197 * 256
  m.vocab = 51200;
  EXPECT_EQ(m.padded_vocab(8), 51200);  // already a multiple
  m.vocab = 32000;
  EXPECT_EQ(m.padded_vocab(1), 32000);  // 250 * 128
}

TEST(ModelSpecTest, EmbeddingAndOutputParams) {
  const ModelSpec gpt = MustLoad("configs/models/gpt3-175b.yaml");
  // Tied: input embedding at padded V (51200 at t 8) plus s*h positions; output only the
  // final LayerNorm.
  EXPECT_EQ(gpt.embedding_params(8), 51200 * 12288 + 2048 * 12288);
  EXPECT_EQ(gpt.output_params(8), 2 * 12288);
  const ModelSpec llama = MustLoad("configs/models/llama2-7b.yaml");
  // RoPE: no position table; untied: the output layer has its own V*h; RMSNorm is h.
  EXPECT_EQ(llama.embedding_params(1), 32000 * 4096);
  EXPECT_EQ(llama.output_params(1), 32000 * 4096 + 4096);
}

TEST(ModelSpecTest, ValidateModelRules) {
  ModelSpec m;
  m.layers = 2; m.hidden = 64; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 256;
  m.seq_len = 16; m.vocab = 100;
  EXPECT_TRUE(ValidateModel(m, "x").ok());
  ModelSpec bad = m;
  bad.hidden = 66;  // 66 % 4 != 0
  Status s = ValidateModel(bad, "where");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("where: "));
  EXPECT_THAT(s.message(), HasSubstr("66"));
  bad = m;
  bad.kv_heads = 3;  // 4 % 3 != 0
  EXPECT_FALSE(ValidateModel(bad, "x").ok());
  bad = m;
  bad.kv_heads = 8;  // more KV heads than heads
  EXPECT_FALSE(ValidateModel(bad, "x").ok());
  bad = m;
  bad.vocab = 0;
  EXPECT_FALSE(ValidateModel(bad, "x").ok());
}

// ---------------------------------------------------------------------------------------------
// Model YAML errors: file, line where there is one, key and value.

constexpr char kGoodBody[] =
    "layers: 4\n"
    "hidden: 64\n"
    "heads: 4\n"
    "seq_len: 32\n"
    "vocab: 256\n";

TEST(ModelYamlTest, MinimalFileTakesDefaults) {
  Result<ModelSpec> r = LoadModelFile(WriteTemp("minimal.yaml", kGoodBody));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->name, "model");
  EXPECT_EQ(r->kv_heads, 4);      // = heads
  EXPECT_EQ(r->ffn_hidden, 256);  // = 4h
  EXPECT_EQ(r->activation, Activation::kGelu);
  EXPECT_EQ(r->norm, Norm::kLayerNorm);
  EXPECT_EQ(r->position, PositionEmbedding::kLearned);
  EXPECT_TRUE(r->tied_embeddings);
  EXPECT_TRUE(r->bias);
}

struct BadYaml {
  const char* label;
  std::string text;
  std::vector<std::string> in_message;  // pieces the error must contain (besides the file)
};

TEST(ModelYamlTest, BadFilesNameFileLineAndKey) {
  const std::string good = kGoodBody;
  const BadYaml cases[] = {
      {"unknown_key", good + "hiden: 64\n", {":6:", "unknown key 'hiden'", "valid keys"}},
      {"missing_layers", "hidden: 64\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {"layers", "missing required key"}},
      {"negative_hidden", "layers: 4\nhidden: -64\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {":2:", "hidden", "'-64'", "must be positive"}},
      {"heads_not_dividing_hidden", "layers: 4\nhidden: 64\nheads: 5\nseq_len: 32\nvocab: 256\n",
       {":3:", "heads", "'5'", "does not divide hidden 64"}},
      {"kv_not_dividing_heads", good + "kv_heads: 3\n",
       {":6:", "kv_heads", "'3'", "does not divide heads 4"}},
      {"string_layers", "layers: four\nhidden: 64\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {":1:", "layers", "'four'", "not an integer"}},
      {"float_layers", "layers: 4.5\nhidden: 64\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {":1:", "layers", "'4.5'", "not an integer"}},
      {"bad_enum", good + "activation: relu\n",
       {":6:", "activation", "'relu'", "gelu, swiglu, squared_relu"}},
      {"bad_bool", good + "bias: maybe\n", {":6:", "bias", "'maybe'", "not a boolean"}},
      {"list_for_hidden", "layers: 4\nhidden: [64]\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {":2:", "hidden", "not an integer"}},
      // Found by fuzz/model_fuzz: 4 * hidden (the default ffn_hidden) overflowed int64.
      {"huge_hidden", "layers: 4\nhidden: 6549109558124245452\nheads: 4\nseq_len: 32\nvocab: 256\n",
       {":2:", "hidden", "'6549109558124245452' is larger than the limit 1048576"}},
      {"huge_vocab", "layers: 4\nhidden: 64\nheads: 4\nseq_len: 32\nvocab: 16777217\n",
       {":5:", "vocab", "larger than the limit 16777216"}},
      {"duplicate_key", good + "vocab: 512\n", {":6:", "duplicate key 'vocab'", "line 5"}},
      {"malformed", "layers: 4\nhidden: [64\nheads: 4\n", {"malformed YAML"}},
      {"not_a_map", "- layers\n- hidden\n", {"must be a mapping"}},
      {"empty", "", {"empty"}},
  };
  for (const BadYaml& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = WriteTemp(std::string("bad_") + c.label + ".yaml", c.text);
    Result<ModelSpec> r = LoadModelFile(path);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(path));
    for (const std::string& piece : c.in_message)
      EXPECT_THAT(r.status().message(), HasSubstr(piece));
  }
}

// Extreme integers for the sizes: refused naming the file, line, key, value and limit (the
// limits of core/limits.h keep L*h*h*4 and L*f*h*3 inside int64).
TEST(ModelYamlTest, ExtremeSizesAreRefusedNamingKeyValueAndLimit) {
  const std::string tail = "heads: 4\nseq_len: 32\nvocab: 256\n";
  const BadYaml cases[] = {
      {"int64_max_layers", "layers: 9223372036854775807\nhidden: 64\n" + tail,
       {":1:", "layers: '9223372036854775807' is larger than the limit 65536"}},
      {"int32_max_hidden", "layers: 4\nhidden: 2147483647\n" + tail,
       {":2:", "hidden: '2147483647' is larger than the limit 1048576"}},
      {"hex_hidden", "layers: 4\nhidden: 0x7fffffff\n" + tail,
       {":2:", "hidden: '0x7fffffff' is not an integer"}},
      {"float_hidden", "layers: 4\nhidden: 1e308\n" + tail, {":2:", "hidden: '1e308' is not an integer"}},
      {"inf_layers", "layers: .inf\nhidden: 64\n" + tail, {":1:", "layers: '.inf' is not an integer"}},
      {"nan_layers", "layers: .nan\nhidden: 64\n" + tail, {":1:", "layers: '.nan' is not an integer"}},
      {"zero_layers", "layers: 0\nhidden: 64\n" + tail, {":1:", "layers: '0' must be positive"}},
      {"minus_zero_layers", "layers: -0\nhidden: 64\n" + tail, {":1:", "layers: '-0' must be positive"}},
      {"million_token_ok_but_not_2^25", "layers: 4\nhidden: 64\nheads: 4\nseq_len: 33554432\nvocab: 256\n",
       {":4:", "seq_len: '33554432' is larger than the limit 16777216"}},
  };
  for (const BadYaml& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = WriteTemp(std::string("extreme_") + c.label + ".yaml", c.text);
    Result<ModelSpec> r = LoadModelFile(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message().rfind(path + ":", 0), 0u) << r.status().message();
    for (const std::string& piece : c.in_message)
      EXPECT_THAT(r.status().message(), HasSubstr(piece));
  }
  // The largest real shapes load: a 1M-token sequence, Megatron-1T's widths.
  const std::string big = WriteTemp("extreme_big.yaml",
                                    "layers: 128\nhidden: 25600\nheads: 160\nffn_hidden: 102400\n"
                                    "seq_len: 1048576\nvocab: 256000\n");
  EXPECT_TRUE(LoadModelFile(big).ok());
}

// A model name that is not UTF-8 would break every --json output: refused by name.
TEST(ModelYamlTest, NonUtf8NameIsRefusedNamingTheKey) {
  const std::string path = WriteTemp("bad_utf8.yaml", std::string("name: \"gpt\xff\"\n") + kGoodBody);
  Result<ModelSpec> r = LoadModelFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path + ":1: name: 'gpt\\xff' is not valid UTF-8");
}

// In a Hugging Face config.json the JSON parser refuses a non-UTF-8 string; the message shows
// the byte escaped, so it is printable itself. Extreme numbers are refused by key.
TEST(HfImportTest, NonUtf8AndExtremeNumbersAreRefused) {
  const std::string llama =
      R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "max_position_embeddings": 128, "vocab_size": 256)";
  Result<ModelSpec> r = ImportHfConfigText(llama + ", \"_name_or_path\": \"x\xff\"}", "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("c.json: malformed JSON"));
  EXPECT_THAT(r.status().message(), HasSubstr("\\xff"));
  EXPECT_TRUE(IsUtf8(r.status().message()));
  r = ImportHfConfigText(llama + ", \"intermediate_size\": 1e308}", "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'intermediate_size' = 1e+308 must be a positive integer"));
  r = ImportHfConfigText(llama + ", \"intermediate_size\": 9223372036854775807}", "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("'intermediate_size' = 9223372036854775807 is larger than any model size"));
  r = ImportHfConfigText(llama + ", \"intermediate_size\": -1}", "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'intermediate_size' = -1 must be a positive integer"));
  EXPECT_TRUE(ImportHfConfigText(llama + ", \"intermediate_size\": 256}", "c.json").ok());
}

TEST(ModelYamlTest, MissingFileNamesIt) {
  const std::string path = ::testing::TempDir() + "/no_such_model.yaml";
  Result<ModelSpec> r = LoadModelFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("cannot open"));
}

TEST(ModelYamlTest, ModelToYamlRoundTrips) {
  const ModelSpec m = MustLoad("configs/models/llama3-70b.yaml");
  Result<ModelSpec> back = LoadModelFile(WriteTemp("roundtrip.yaml", ModelToYaml(m, "")));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->name, m.name);
  EXPECT_EQ(back->layers, m.layers);
  EXPECT_EQ(back->hidden, m.hidden);
  EXPECT_EQ(back->heads, m.heads);
  EXPECT_EQ(back->kv_heads, m.kv_heads);
  EXPECT_EQ(back->ffn_hidden, m.ffn_hidden);
  EXPECT_EQ(back->seq_len, m.seq_len);
  EXPECT_EQ(back->vocab, m.vocab);
  EXPECT_EQ(back->activation, m.activation);
  EXPECT_EQ(back->norm, m.norm);
  EXPECT_EQ(back->position, m.position);
  EXPECT_EQ(back->tied_embeddings, m.tied_embeddings);
  EXPECT_EQ(back->bias, m.bias);
  EXPECT_EQ(back->dropout, m.dropout);
  EXPECT_FALSE(m.dropout);  // llama3-70b.yaml: dropout: false
  // BLOOM: ALiBi positions (no parameters), no dropout; both round trip.
  const ModelSpec bloom = MustLoad("configs/models/bloom-176b.yaml");
  EXPECT_EQ(bloom.position, PositionEmbedding::kAlibi);
  EXPECT_FALSE(bloom.dropout);
  EXPECT_NEAR(double(bloom.total_params()), 176247271424.0, 0.001 * 176247271424.0);  // paper, table 3
  Result<ModelSpec> b2 = LoadModelFile(WriteTemp("bloom.yaml", ModelToYaml(bloom, "")));
  ASSERT_TRUE(b2.ok()) << b2.status().message();
  EXPECT_EQ(b2->position, PositionEmbedding::kAlibi);
  EXPECT_FALSE(b2->dropout);
  // Megatron's default: dropout on when the key is absent.
  EXPECT_TRUE(MustLoad("configs/models/gpt3-175b.yaml").dropout);
}

// A hybrid model's keys: the pattern and the Mamba sizes round trip; left out, the sizes take
// Megatron's defaults (state 128, head dim 64, groups 8, heads 2 h / head dim); errors name the
// file, line and key.
TEST(ModelYamlTest, HybridPatternAndMambaSizes) {
  // The shipped Nemotron-H 8B is what its Hugging Face config imports as.
  const ModelSpec h8 = MustLoad("configs/models/nemotron-h-8b.yaml");
  const Result<ModelSpec> h8_hf = ImportHfConfig(SourcePath("tests/data/hf/Nemotron-H-8B-Base-8K.json"));
  ASSERT_TRUE(h8_hf.ok()) << h8_hf.status().message();
  EXPECT_EQ(h8.hybrid_pattern, h8_hf->hybrid_pattern);
  EXPECT_EQ(h8.total_params(), h8_hf->total_params());
  EXPECT_EQ(h8.seq_len, h8_hf->seq_len);
  const ModelSpec nano = MustLoad("configs/models/nemotron3-nano.yaml");
  EXPECT_EQ(nano.hybrid_pattern.size(), 52u);
  EXPECT_EQ(nano.position, PositionEmbedding::kNone);
  EXPECT_NEAR(double(nano.total_params()), 31.6e9, 0.005 * 31.6e9);  // model card: 31.6B
  Result<ModelSpec> back = LoadModelFile(WriteTemp("nano.yaml", ModelToYaml(nano, "")));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->hybrid_pattern, nano.hybrid_pattern);
  EXPECT_EQ(back->mamba_num_heads, 64);
  EXPECT_EQ(back->mamba_head_dim, 64);
  EXPECT_EQ(back->mamba_num_groups, 8);
  EXPECT_EQ(back->mamba_state_dim, 128);
  EXPECT_EQ(back->position, PositionEmbedding::kNone);
  EXPECT_EQ(back->total_params(), nano.total_params());
  const std::string base =
      "name: h\nlayers: 4\nhidden: 1024\nheads: 8\nseq_len: 2048\nvocab: 1000\n";
  Result<ModelSpec> d = LoadModelFile(WriteTemp("h.yaml", base + "hybrid_pattern: \"M*M-\"\n"));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->mamba_state_dim, 128);
  EXPECT_EQ(d->mamba_head_dim, 64);
  EXPECT_EQ(d->mamba_num_groups, 8);
  EXPECT_EQ(d->mamba_num_heads, 32);  // 2 x 1024 / 64
  Result<ModelSpec> bad = LoadModelFile(WriteTemp("bad.yaml", base + "hybrid_pattern: \"M*M\"\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hybrid_pattern"), std::string::npos);
  EXPECT_NE(bad.status().message().find("has 3 layer symbols but layers is 4"), std::string::npos);
  bad = LoadModelFile(WriteTemp("bad2.yaml", base + "mamba_head_dim: 64\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mamba_head_dim"), std::string::npos);
}

TEST(ModelYamlTest, ToStringSpellingsAreTheYamlValues) {
  EXPECT_STREQ(ToString(Activation::kGelu), "gelu");
  EXPECT_STREQ(ToString(Activation::kSwiglu), "swiglu");
  EXPECT_STREQ(ToString(Activation::kSquaredRelu), "squared_relu");
  EXPECT_STREQ(ToString(Norm::kLayerNorm), "layernorm");
  EXPECT_STREQ(ToString(Norm::kRmsNorm), "rmsnorm");
  EXPECT_STREQ(ToString(PositionEmbedding::kLearned), "learned");
  EXPECT_STREQ(ToString(PositionEmbedding::kRope), "rope");
  EXPECT_STREQ(ToString(PositionEmbedding::kAlibi), "alibi");
  EXPECT_STREQ(ToString(PositionEmbedding::kNone), "none");
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json import (fixtures in tests/data/hf/).

TEST(HfImportTest, Gpt2) {
  Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/gpt2.json"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelSpec& m = *r;
  EXPECT_EQ(m.name, "gpt2");  // no _name_or_path: the file name
  EXPECT_EQ(m.layers, 12);
  EXPECT_EQ(m.hidden, 768);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 12);
  EXPECT_EQ(m.ffn_hidden, 3072);  // n_inner absent: 4h
  EXPECT_EQ(m.seq_len, 1024);
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.activation, Activation::kGelu);
  EXPECT_EQ(m.norm, Norm::kLayerNorm);
  EXPECT_EQ(m.position, PositionEmbedding::kLearned);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_TRUE(m.bias);
  EXPECT_EQ(m.dropout, true);  // resid_pdrop / attn_pdrop 0.1
  // HF's published count for gpt2: 124,439,808 = 12*(12*768^2 + 13*768) + (50257 + 1024)*768
  // + 2*768 (ln_f). It includes the final LayerNorm, as total_params() does.
  EXPECT_EQ(m.total_params(), 124439808);
}

TEST(HfImportTest, Llama2_7b) {
  Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/llama.json"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelSpec& m = *r;
  EXPECT_EQ(m.name, "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 32);
  EXPECT_EQ(m.ffn_hidden, 11008);
  EXPECT_EQ(m.seq_len, 4096);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_EQ(m.activation, Activation::kSwiglu);  // hidden_act silu
  EXPECT_EQ(m.norm, Norm::kRmsNorm);             // rms_norm_eps present
  EXPECT_EQ(m.position, PositionEmbedding::kRope);
  EXPECT_FALSE(m.dropout);  // attention_dropout 0.0 (or absent)
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.bias);
  // Same shape as configs/models/llama2-7b.yaml.
  EXPECT_EQ(m.total_params(), MustLoad("configs/models/llama2-7b.yaml").total_params());
}

TEST(HfImportTest, Mistral7b) {
  Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/mistral.json"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelSpec& m = *r;
  EXPECT_EQ(m.name, "mistral");  // no _name_or_path: the file name
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);        // num_key_value_heads
  EXPECT_EQ(m.ffn_hidden, 14336);
  // Not max_position_embeddings 32768 (the context limit): the 4096 default, and a note.
  EXPECT_EQ(m.seq_len, 4096);
  EXPECT_THAT(m.seq_len_note, HasSubstr("max_position_embeddings 32768 is the context limit"));
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_EQ(m.activation, Activation::kSwiglu);
  EXPECT_FALSE(m.tied_embeddings);
  // Mistral-7B-v0.1: 7,241,732,096 parameters (HF).
  EXPECT_EQ(m.total_params(), 7241732096);
}

TEST(HfImportTest, MalformedJsonNamesFile) {
  const std::string path = SourcePath("tests/data/hf/malformed.json");
  Result<ModelSpec> r = ImportHfConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("malformed JSON"));
}

TEST(HfImportTest, MissingKeyNamesFileAndKey) {
  const std::string path = SourcePath("tests/data/hf/missing_heads.json");
  Result<ModelSpec> r = ImportHfConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("'num_attention_heads'"));
}

TEST(HfImportTest, MissingFileNamesIt) {
  const std::string path = ::testing::TempDir() + "/no_such_config.json";
  Result<ModelSpec> r = ImportHfConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
}

// A field of the wrong JSON type (here the string "false" for a boolean) is a Status naming
// the file and key, not an exception.
TEST(HfImportTest, WrongTypeIsAnErrorNotAnException) {
  const std::string path = SourcePath("tests/data/hf/bad_type.json");
  Result<ModelSpec> r = ModelSpec{};
  EXPECT_NO_THROW(r = ImportHfConfig(path));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("tie_word_embeddings"));
}

TEST(LoadModelTest, DispatchesOnHfPrefix) {
  Result<ModelSpec> hf = LoadModel("hf:" + SourcePath("tests/data/hf/mistral.json"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->kv_heads, 8);
  Result<ModelSpec> yaml = LoadModel(SourcePath("configs/models/gpt3-175b.yaml"));
  ASSERT_TRUE(yaml.ok()) << yaml.status().message();
  EXPECT_EQ(yaml->name, "gpt3-175b");
  // A JSON file without the prefix is read as YAML (JSON is YAML) and fails on its keys.
  Result<ModelSpec> no_prefix = LoadModel(SourcePath("tests/data/hf/mistral.json"));
  EXPECT_FALSE(no_prefix.ok());
  // "hf:" with a missing file names the file without the prefix.
  const std::string missing = ::testing::TempDir() + "/missing.json";
  Result<ModelSpec> bad = LoadModel("hf:" + missing);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(missing));
}


// ---------------------------------------------------------------------------------------------
// Mixture of Experts and multi-latent attention.

TEST(MoeModelTest, PublishedTotalAndActiveCounts) {
  struct Case {
    const char* file;
    double total, active;  // published; active 0 where none is published
  };
  // DeepSeek-V3 report (671B / 37B, without the 14B MTP module); Mistral AI (46.7B / 12.9B,
  // 141B / 39B); Meta (400B / 17B); xAI (314B).
  const Case cases[] = {
      {"deepseek-v3", 671e9, 37e9},  {"mixtral-8x7b", 46.7e9, 12.9e9},
      {"mixtral-8x22b", 141e9, 39e9}, {"llama4-maverick", 400e9, 17e9},
      {"grok-1", 314e9, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const ModelSpec m = MustLoad(std::string("configs/models/") + c.file + ".yaml");
    EXPECT_TRUE(m.moe());
    EXPECT_NEAR(double(m.total_params()), c.total, 0.03 * c.total);
    if (c.active > 0) {
      EXPECT_NEAR(double(m.active_params()), c.active, 0.03 * c.active);
    }
    EXPECT_LT(m.active_params(), m.total_params());
  }
}

TEST(MoeModelTest, LayerPatternCountsMoeLayers) {
  ModelSpec m = MustLoad("configs/models/deepseek-v3.yaml");
  EXPECT_EQ(m.moe_layers(), 58);
  EXPECT_FALSE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  EXPECT_EQ(m.moe_layers_in(0, 4), 1);
  EXPECT_EQ(m.moe_layers_in(2, 10), 9);
  ModelSpec l4 = MustLoad("configs/models/llama4-maverick.yaml");
  EXPECT_EQ(l4.moe_layers(), 24);
  EXPECT_FALSE(l4.is_moe_layer(0));
  EXPECT_TRUE(l4.is_moe_layer(1));
  // moe_layers_in agrees with is_moe_layer on every window.
  for (const ModelSpec* s : {&m, &l4})
    for (int64_t a = 0; a < s->layers; ++a)
      for (int64_t n = 0; a + n <= s->layers; n += 3) {
        int64_t count = 0;
        for (int64_t i = a; i < a + n; ++i) count += s->is_moe_layer(i);
        ASSERT_EQ(s->moe_layers_in(a, n), count) << a << " " << n;
      }
  // The layer sums add up to the total.
  EXPECT_EQ(m.layer_params(0, 30) + m.layer_params(30, 31), m.layer_params(0, 61));
}

TEST(MoeModelTest, MlaAttentionCount) {
  const ModelSpec m = MustLoad("configs/models/deepseek-v3.yaml");
  // DeepSeek-V3: q 7168x1536 + 1536x128x192, kv 7168x576 + 512x128x256, out 128x128x7168.
  const int64_t expect = 7168LL * 1536 + 1536LL * 128 * 192 + 7168LL * 576 + 512LL * 128 * 256 +
                         128LL * 128 * 7168;
  EXPECT_EQ(m.attention_linear_params(), expect);
  EXPECT_GT(m.mtp_params(), 11e9);  // ~11.5B of the 14B MTP module (the rest is shared)
}

TEST(MoeModelTest, YamlRoundTripsAndRulesNameTheKey) {
  const ModelSpec m = MustLoad("configs/models/deepseek-v3.yaml");
  const std::string yaml = ModelToYaml(m, "");
  Result<ModelSpec> back = LoadModelFile(WriteTemp("dsv3-back.yaml", yaml));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->total_params(), m.total_params());
  EXPECT_EQ(back->active_params(), m.active_params());
  EXPECT_EQ(ModelToYaml(*back, ""), yaml);
  struct Bad {
    const char* extra;
    const char* key;
  };
  const Bad bad[] = {
      {"num_experts: 8\nmoe_topk: 9\nmoe_ffn_hidden: 64\n", "moe_topk"},
      {"moe_topk: 2\n", "moe_topk"},
      {"num_experts: 8\nmoe_topk: 2\n", "moe_ffn_hidden"},
      {"num_experts: 8\nmoe_topk: 2\nmoe_ffn_hidden: 64\nmoe_routing: capacity\n",
       "moe_capacity_factor"},
      {"kv_lora_rank: 64\n", "kv_lora_rank"},
      {"v_head_dim: 64\n", "v_head_dim"},
      {"num_experts: 8\nmoe_topk: 2\nmoe_ffn_hidden: 64\nmoe_dense_layers_first: 99\n",
       "moe_dense_layers_first"},
      {"moe_router: relu\n", "moe_router"},
      {"num_experts: 8\nmoe_topk: 2\nmoe_ffn_hidden: 64\nmoe_aux_loss_coeff: -0.1\n",
       "moe_aux_loss_coeff"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.extra);
    Result<ModelSpec> r = LoadModelFile(WriteTemp("bad-moe.yaml", std::string(kGoodBody) + b.extra));
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(b.key));
  }
}


TEST(MoeModelTest, TheRuntimeRefusesWhatItDoesNotTrain) {
  ModelSpec m = MustLoad("configs/models/gpt-tiny.yaml");
  ASSERT_TRUE(CheckGptShaped(m).ok());
  ModelSpec moe = m;
  moe.num_experts = 4; moe.moe_topk = 2; moe.moe_ffn_hidden = moe.ffn_hidden;
  EXPECT_TRUE(CheckGptShaped(moe).ok()) << CheckGptShaped(moe).message();  // dropless: trained
  moe.moe_routing = MoeRouting::kCapacity;
  moe.moe_capacity_factor = 1.25;
  EXPECT_THAT(CheckGptShaped(moe).message(), HasSubstr("moe_routing capacity"));
  moe.moe_routing = MoeRouting::kBalanced;
  moe.moe_capacity_factor = 0;
  EXPECT_THAT(CheckGptShaped(moe).message(), HasSubstr("moe_routing balanced"));
  ModelSpec win = m;
  win.sliding_window = 16;
  EXPECT_THAT(CheckGptShaped(win).message(), HasSubstr("sliding_window"));
  ModelSpec par = m;
  par.parallel_attn_mlp = true;
  EXPECT_THAT(CheckGptShaped(par).message(), HasSubstr("parallel_attn_mlp"));
}

}  // namespace
}  // namespace ptdp
