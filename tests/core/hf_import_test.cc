// Hugging Face config.json import (core/hf_import.cc): each family's reference config
// (tests/data/hf/, README.md there says where each comes from) imports to its published total
// and active parameter counts (within 1% dense, 3% MoE), with the features it states (experts,
// MLA, head size, activation, tied embeddings, windows), a stated sequence length and note, and
// its name; what ptdp does not model is refused with a message naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <yaml-cpp/yaml.h>

#include "core/model.h"
#include "tests/core/test_util.h"

namespace ptdp {
namespace {

using ::ptdp::testing_util::SourcePath;
using ::ptdp::testing_util::WriteTemp;
using ::testing::HasSubstr;
using ::testing::Not;

ModelSpec MustImport(const std::string& fixture) {
  Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/" + fixture + ".json"));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : ModelSpec{};
}

// The error of importing `json` (as the file <name>.json); "" when it imports.
std::string ImportError(const std::string& name, const std::string& json) {
  Result<ModelSpec> r = ImportHfConfig(WriteTemp(name + ".json", json));
  return r.ok() ? "" : r.status().message();
}

// ---------------------------------------------------------------------------------------------
// Published parameter counts.
//
// ptdp's counts: total_params() counts a tied embedding once and leaves MTP modules out;
// active_params() is every weight one token meets, both embedding matrices included. Two
// vendor conventions differ, and the table says where:
//  - DeepSeek (V2 paper, Lite: 15.7B / 2.4B), Moonshot and OpenAI publish activated counts
//    without the input embedding, a table lookup (V2-Lite's 2.4B is 2.45B without it and
//    2.66B with it); Mistral AI and Qwen count both matrices (Mixtral 12.9B, Qwen3-30B-A3B 3.3B
//    only add up with them).
//  - Falcon's checkpoints store the tied lm_head a second time, and the published 7.22B / 41.8B
//    (the checkpoints' sizes) count it twice: transformers ties it (FalconConfig's
//    tie_word_embeddings defaults to true; the original RWForCausalLM lists lm_head.weight as
//    loadable from the embedding), so the model has V*h fewer weights.

struct Published {
  const char* fixture;
  double total, active;  // published; active 0: a dense model (active == total)
  bool active_without_input_embedding = false;
  bool tied_counted_twice = false;
};

const Published kPublished[] = {
    // Dense (1%).
    {"Meta-Llama-3-8B", 8.03e9, 0},          // HF model card: 8,030,261,248
    {"Llama-3.1-405B", 405e9, 0},            // Llama 3 paper (Dubey et al. 2024), Table 3
    {"llama", 6.74e9, 0},                    // Llama-2-7b-hf: 6,738,415,616 (HF)
    {"mistral", 7.24e9, 0},                  // Mistral-7B-v0.1: 7,241,732,096 (HF)
    {"Qwen2.5-7B", 7.61e9, 0},               // Qwen2.5-7B model card: 7.61B
    {"Qwen3-8B", 8.19e9, 0},                 // Qwen3-8B model card: 8.2B (8,190,735,360)
    {"gemma-2-9b", 9.24e9, 0},               // HF: 9,241,705,984
    {"gemma-3-27b-pt", 27.016e9, 0},         // Gemma 3 report Table 1: 1,416M embedding +
                                             // 25,600M non-embedding (the 417M vision tower
                                             // is not imported)
    {"falcon-7b", 7.22e9, 0, false, true},   // checkpoint: 7,217,189,760 (lm_head twice)
    {"falcon-7b-RefinedWebModel", 7.22e9, 0, false, true},
    {"falcon-40b", 41.8e9, 0, false, true},  // checkpoint: 41.8B (lm_head twice)
    {"gpt-neox-20b", 20.55e9, 0},            // Black et al. 2022: 20,554,567,680
    {"Phi-3-mini-4k-instruct", 3.82e9, 0},   // Phi-3 report: 3.8B (3,821,079,552 HF)
    {"gpt2", 124.44e6, 0},                   // HF: 124,439,808
    // MoE (3%).
    {"Mixtral-8x7B-v0.1", 46.7e9, 12.9e9},   // Mistral AI, Mixtral of experts (2023)
    {"Mixtral-8x22B-v0.1", 141e9, 39e9},     // Mistral AI, Mixtral 8x22B (2024)
    {"Qwen2-57B-A14B", 57.4e9, 14.2e9},      // Qwen2 report / model card: 57.4B, 14.2B active
    {"Qwen3-235B-A22B", 235e9, 22e9},        // Qwen3-235B-A22B model card
    {"Qwen3-30B-A3B", 30.5e9, 3.3e9},        // Qwen3-30B-A3B model card
    {"DeepSeek-V2-Lite", 15.7e9, 2.4e9, true},  // DeepSeek-V2 paper (Lite: 15.7B, 2.4B)
    {"DeepSeek-V2.5", 236e9, 21e9, true},       // DeepSeek-V2 paper: 236B, 21B (V2.5 keeps V2)
    {"DeepSeek-V3", 671e9, 37e9, true},         // DeepSeek-V3 report (without the 14B MTP)
    {"Kimi-K2-Instruct", 1.04e12, 32e9, true},  // Kimi K2 report: 1.04T, 32B activated
    {"gpt-oss-120b", 116.83e9, 5.13e9, true},   // OpenAI gpt-oss model card, Table 1
    {"gpt-oss-20b", 20.91e9, 3.61e9, true},     // same table
};

TEST(HfImportCounts, MatchPublishedFigures) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.fixture);
    const ModelSpec m = MustImport(p.fixture);
    const double embedding = double(m.vocab) * double(m.hidden);
    const double total = p.total - (p.tied_counted_twice ? embedding : 0);
    const double tol = p.active > 0 ? 0.03 : 0.01;
    EXPECT_EQ(m.moe(), p.active > 0);
    EXPECT_NEAR(double(m.total_params()), total, tol * total);
    if (p.active > 0) {
      const double active = p.active + (p.active_without_input_embedding ? embedding : 0);
      EXPECT_NEAR(double(m.active_params()), active, tol * active);
      EXPECT_LT(m.active_params(), m.total_params());
    } else {
      EXPECT_EQ(m.active_params(), m.total_params());
    }
  }
}

// The exact counts where the published figure is exact.
TEST(HfImportCounts, ExactWhereTheFigureIsExact) {
  EXPECT_EQ(MustImport("Meta-Llama-3-8B").total_params(), 8030261248);
  EXPECT_EQ(MustImport("mistral").total_params(), 7241732096);
  EXPECT_EQ(MustImport("gpt2").total_params(), 124439808);
  EXPECT_EQ(MustImport("gpt-neox-20b").total_params(), 20554567680);
  EXPECT_EQ(MustImport("Phi-3-mini-4k-instruct").total_params(), 3821079552);
  // Gemma 2 has four RMSNorms a layer (before and after attention and MLP); ModelSpec counts
  // two (2 h L = 301,056 of 9.24B).
  const ModelSpec gemma = MustImport("gemma-2-9b");
  EXPECT_EQ(gemma.total_params() + 2 * gemma.hidden * gemma.layers, 9241705984);
  // Falcon-7B's checkpoint, 14,434,379,520 bytes of bf16, holds lm_head a second time; its
  // attention and MLP share one LayerNorm, where ModelSpec counts two (2 h L = 290,816).
  const ModelSpec falcon = MustImport("falcon-7b");
  EXPECT_EQ(falcon.total_params() + falcon.vocab * falcon.hidden - 2 * falcon.hidden * falcon.layers,
            14434379520 / 2);
}

// ---------------------------------------------------------------------------------------------
// Features per family.

TEST(HfImportFeatures, Llama) {
  const ModelSpec m = MustImport("Llama-3.1-405B");
  EXPECT_EQ(m.layers, 126);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.activation, Activation::kSwiglu);
  EXPECT_EQ(m.norm, Norm::kRmsNorm);
  EXPECT_EQ(m.rotary_base, 500000);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.bias);
  EXPECT_FALSE(m.moe());
  EXPECT_EQ(m.kv_channels, 0);  // 16384 / 128
}

TEST(HfImportFeatures, MistralAndMixtral) {
  const ModelSpec mistral = MustImport("mistral");
  EXPECT_EQ(mistral.sliding_window, 4096);  // every layer windowed
  EXPECT_EQ(mistral.global_attention_every, 0);
  const ModelSpec m = MustImport("Mixtral-8x7B-v0.1");
  EXPECT_TRUE(m.moe());
  EXPECT_EQ(m.num_experts, 8);  // num_local_experts
  EXPECT_EQ(m.moe_topk, 2);
  EXPECT_EQ(m.moe_ffn_hidden, 14336);  // intermediate_size is each expert's width
  EXPECT_EQ(m.moe_shared_ffn_hidden, 0);
  EXPECT_EQ(m.moe_layers(), 32);
  EXPECT_EQ(m.moe_router, MoeRouter::kSoftmax);
  EXPECT_EQ(m.sliding_window, 0);  // null
  EXPECT_EQ(m.rotary_base, 1e6);
}

TEST(HfImportFeatures, Qwen) {
  const ModelSpec dense = MustImport("Qwen2.5-7B");
  EXPECT_EQ(dense.sliding_window, 0);  // use_sliding_window false
  EXPECT_FALSE(dense.bias);            // q/k/v-only biases (ModelSpec's bias is all or none)
  const ModelSpec q2 = MustImport("Qwen2-57B-A14B");
  EXPECT_EQ(q2.num_experts, 64);
  EXPECT_EQ(q2.moe_topk, 8);
  EXPECT_EQ(q2.moe_ffn_hidden, 2560);
  EXPECT_EQ(q2.moe_shared_ffn_hidden, 20480);  // shared_expert_intermediate_size
  EXPECT_EQ(q2.moe_layers(), 28);               // decoder_sparse_step 1
  const ModelSpec q3 = MustImport("Qwen3-235B-A22B");
  EXPECT_EQ(q3.kv_channels, 128);  // head_dim 128, hidden / heads 64
  EXPECT_EQ(q3.num_experts, 128);
  EXPECT_EQ(q3.moe_ffn_hidden, 1536);
  EXPECT_EQ(q3.moe_shared_ffn_hidden, 0);
  EXPECT_EQ(MustImport("Qwen3-8B").kv_channels, 0);  // head_dim 128 == 4096 / 32
}

TEST(HfImportFeatures, DeepSeekAndKimi) {
  const ModelSpec v3 = MustImport("DeepSeek-V3");
  EXPECT_TRUE(v3.mla());
  EXPECT_EQ(v3.q_lora_rank, 1536);
  EXPECT_EQ(v3.kv_lora_rank, 512);
  EXPECT_EQ(v3.qk_head_dim, 128);
  EXPECT_EQ(v3.qk_pos_head_dim, 64);
  EXPECT_EQ(v3.v_head_dim, 128);
  EXPECT_EQ(v3.num_experts, 256);
  EXPECT_EQ(v3.moe_shared_ffn_hidden, 2048);  // n_shared_experts 1 x moe_intermediate_size
  EXPECT_EQ(v3.moe_dense_layers_first, 3);    // first_k_dense_replace
  EXPECT_EQ(v3.moe_layers(), 58);
  EXPECT_EQ(v3.moe_router, MoeRouter::kSigmoid);
  EXPECT_EQ(v3.mtp_layers, 1);  // num_nextn_predict_layers
  // The same shape as the shipped configs/models/deepseek-v3.yaml.
  Result<ModelSpec> yaml = LoadModelFile(SourcePath("configs/models/deepseek-v3.yaml"));
  ASSERT_TRUE(yaml.ok()) << yaml.status().message();
  EXPECT_EQ(v3.total_params(), yaml->total_params());
  EXPECT_EQ(v3.active_params(), yaml->active_params());

  const ModelSpec lite = MustImport("DeepSeek-V2-Lite");
  EXPECT_TRUE(lite.mla());
  EXPECT_EQ(lite.q_lora_rank, 0);  // null: a full query projection
  EXPECT_EQ(lite.moe_shared_ffn_hidden, 2 * 1408);
  EXPECT_EQ(lite.moe_router, MoeRouter::kSoftmax);
  EXPECT_EQ(lite.mtp_layers, 0);

  const ModelSpec kimi = MustImport("Kimi-K2-Instruct");  // model_type kimi_k2
  EXPECT_TRUE(kimi.mla());
  EXPECT_EQ(kimi.heads, 64);
  EXPECT_EQ(kimi.num_experts, 384);
  EXPECT_EQ(kimi.moe_dense_layers_first, 1);
  EXPECT_EQ(kimi.mtp_layers, 0);
}

TEST(HfImportFeatures, Gemma) {
  const ModelSpec g2 = MustImport("gemma-2-9b");
  EXPECT_EQ(g2.activation, Activation::kGeglu);  // gelu_pytorch_tanh in a gated MLP
  EXPECT_EQ(g2.kv_channels, 256);                // head_dim 256, hidden / heads 224
  EXPECT_TRUE(g2.tied_embeddings);               // Gemma2Config's default
  EXPECT_EQ(g2.sliding_window, 4096);
  EXPECT_EQ(g2.global_attention_every, 2);  // layers 1, 3, ... global
  EXPECT_EQ(g2.windowed_layers(), 21);
  const ModelSpec g3 = MustImport("gemma-3-27b-pt");  // text_config of the multimodal config
  EXPECT_EQ(g3.layers, 62);
  EXPECT_EQ(g3.hidden, 5376);
  EXPECT_EQ(g3.vocab, 262208);  // Gemma3TextConfig's default (the config leaves it out)
  EXPECT_EQ(g3.activation, Activation::kGeglu);
  EXPECT_EQ(g3.kv_channels, 128);
  EXPECT_TRUE(g3.tied_embeddings);
  EXPECT_EQ(g3.sliding_window, 1024);
  EXPECT_EQ(g3.global_attention_every, 6);  // sliding_window_pattern's default
  EXPECT_EQ(g3.rotary_base, 10000);          // rope_theta absent
}

TEST(HfImportFeatures, Falcon) {
  for (const char* f : {"falcon-7b", "falcon-7b-RefinedWebModel"}) {
    SCOPED_TRACE(f);
    const ModelSpec m = MustImport(f);
    EXPECT_EQ(m.heads, 71);
    EXPECT_EQ(m.kv_heads, 1);  // multi_query
    EXPECT_EQ(m.ffn_hidden, 4 * 4544);
    EXPECT_EQ(m.activation, Activation::kGelu);  // a GeLU MLP, not SwiGLU
    EXPECT_EQ(m.norm, Norm::kLayerNorm);
    EXPECT_EQ(m.position, PositionEmbedding::kRope);
    EXPECT_TRUE(m.parallel_attn_mlp);
    EXPECT_FALSE(m.bias);
    EXPECT_TRUE(m.tied_embeddings);
  }
  const ModelSpec m40 = MustImport("falcon-40b");
  EXPECT_EQ(m40.kv_heads, 8);  // new_decoder_architecture: num_kv_heads
  EXPECT_TRUE(m40.parallel_attn_mlp);
  // ALiBi instead of rotary.
  EXPECT_EQ(ImportHfConfig(WriteTemp("falcon-alibi.json",
                                     R"({"model_type": "falcon", "alibi": true,
                                         "hidden_size": 64, "num_attention_heads": 4,
                                         "num_hidden_layers": 2, "vocab_size": 100})"))
                ->position,
            PositionEmbedding::kAlibi);
}

TEST(HfImportFeatures, GptNeoxPhiAndGpt2) {
  const ModelSpec neox = MustImport("gpt-neox-20b");
  EXPECT_TRUE(neox.bias);
  EXPECT_TRUE(neox.parallel_attn_mlp);  // use_parallel_residual
  EXPECT_EQ(neox.rotary_percent, 0.25);  // rotary_pct
  EXPECT_EQ(neox.activation, Activation::kGelu);
  EXPECT_FALSE(neox.tied_embeddings);
  const ModelSpec phi = MustImport("Phi-3-mini-4k-instruct");
  EXPECT_EQ(phi.sliding_window, 2047);
  EXPECT_EQ(phi.activation, Activation::kSwiglu);
  const ModelSpec gpt2 = MustImport("gpt2");
  EXPECT_EQ(gpt2.position, PositionEmbedding::kLearned);
  EXPECT_TRUE(gpt2.tied_embeddings);
}

TEST(HfImportFeatures, GptOss) {
  const ModelSpec m = MustImport("gpt-oss-120b");
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.moe_topk, 4);
  EXPECT_EQ(m.moe_ffn_hidden, 2880);
  EXPECT_EQ(m.kv_channels, 64);  // 2880 / 64 is 45
  EXPECT_TRUE(m.bias);           // attention and expert biases
  EXPECT_EQ(m.activation, Activation::kSwiglu);
  EXPECT_EQ(m.sliding_window, 128);
  EXPECT_EQ(m.global_attention_every, 2);  // layer_types: sliding, full, sliding, ...
  EXPECT_EQ(m.windowed_layers(), 18);
}

// Expert keys in a family with no MoE reader of its own are imported, never dropped.
TEST(HfImportFeatures, ExpertKeysAreNeverDropped) {
  Result<ModelSpec> r = ImportHfConfig(WriteTemp("llama-moe.json", R"({
      "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 1000,
      "num_local_experts": 8, "num_experts_per_tok": 2})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_experts, 8);
  EXPECT_EQ(r->moe_topk, 2);
  EXPECT_EQ(r->moe_layers(), 4);
  // DeepSeek's moe_layer_freq: layers >= first_k_dense_replace that it divides.
  r = ImportHfConfig(WriteTemp("ds-freq.json", R"({
      "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 8, "vocab_size": 1000,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "first_k_dense_replace": 1, "moe_layer_freq": 2})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(r->is_moe_layer(i), i >= 1 && i % 2 == 0) << i;
  // A GPT-NeoX config with experts is refused (its reader has no MoE layout).
  EXPECT_THAT(ImportError("neox-moe", R"({"model_type": "gpt_neox", "hidden_size": 64,
      "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 100, "num_experts": 4})"),
              HasSubstr("key 'num_experts' = 4"));
}

// ---------------------------------------------------------------------------------------------
// Sequence length, note and name.

TEST(HfImportSeqLen, NeverMaxPositionEmbeddingsSilently) {
  struct Case {
    const char* fixture;
    int64_t seq;
    const char* note;  // in seq_len_note
  };
  const Case cases[] = {
      {"Llama-3.1-405B", 8192, "rope_scaling.original_max_position_embeddings"},
      {"Meta-Llama-3-8B", 8192, "pre-training context of Llama 1/2/3"},
      {"llama", 4096, "pre-training context of Llama 1/2/3"},
      {"Qwen2.5-7B", 4096, "max_position_embeddings 131072 is the context limit"},
      {"Mixtral-8x7B-v0.1", 4096, "default for an imported config"},
      {"mistral", 4096, "max_position_embeddings 32768 is the context limit"},
      {"DeepSeek-V3", 4096, "rope_scaling.original_max_position_embeddings"},
      {"gpt-oss-120b", 4096, "original_max_position_embeddings"},
      {"Phi-3-mini-4k-instruct", 4096, "original_max_position_embeddings"},
      {"gemma-2-9b", 8192, "Gemma 2 report"},
      {"gemma-3-27b-pt", 32768, "Gemma 3 report"},
      {"falcon-7b", 2048, "Falcon report"},  // the config has no max_position_embeddings
      {"gpt-neox-20b", 2048, "GPT-NeoX-20B"},
      {"gpt2", 1024, "n_positions"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    const ModelSpec m = MustImport(c.fixture);
    EXPECT_EQ(m.seq_len, c.seq);
    EXPECT_THAT(m.seq_len_note, HasSubstr(c.note));
    EXPECT_THAT(m.seq_len_note, HasSubstr("--seq-len sets it"));
  }
  // A YAML model has no note, and the note is not written to YAML.
  Result<ModelSpec> yaml = LoadModelFile(SourcePath("configs/models/llama3-8b.yaml"));
  ASSERT_TRUE(yaml.ok());
  EXPECT_EQ(yaml->seq_len_note, "");
  EXPECT_THAT(ModelToYaml(MustImport("Qwen2.5-7B"), ""), Not(HasSubstr("context limit")));
}

TEST(HfImportName, NameOrPathThenFolderThenFile) {
  EXPECT_EQ(MustImport("llama").name, "meta-llama/Llama-2-7b-hf");  // _name_or_path as written
  EXPECT_EQ(MustImport("Phi-3-mini-4k-instruct").name, "Phi-3-mini-4k-instruct");
  EXPECT_EQ(MustImport("Mixtral-8x7B-v0.1").name, "Mixtral-8x7B-v0.1");  // the file name
  // hf:DIR: the folder's name.
  const std::string dir = ::testing::TempDir() + "/Meta-Llama-3-8B-dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(SourcePath("tests/data/hf/Meta-Llama-3-8B.json"), dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  Result<ModelSpec> r = LoadModel("hf:" + dir);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->name, "Meta-Llama-3-8B-dir");
  r = LoadModel("hf:" + dir + "/");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->name, "Meta-Llama-3-8B-dir");
}

// An imported model written as YAML reads back with the same counts.
TEST(HfImportYaml, RoundTrips) {
  for (const char* f : {"Kimi-K2-Instruct", "gpt-oss-20b", "gemma-3-27b-pt", "falcon-40b",
                        "Qwen2-57B-A14B", "gpt-neox-20b"}) {
    SCOPED_TRACE(f);
    const ModelSpec m = MustImport(f);
    Result<ModelSpec> back = LoadModelFile(WriteTemp("back.yaml", ModelToYaml(m, "")));
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->total_params(), m.total_params());
    EXPECT_EQ(back->active_params(), m.active_params());
    EXPECT_EQ(back->seq_len, m.seq_len);
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals: one line naming the file, the key and its value.

// Nemotron-H 8B (nemotron_h): 52 layers by hybrid_override_pattern, 24 Mamba-2 mixers of 128
// heads x 64, 4 attention layers, 24 squared-ReLU MLPs; 8.1B parameters (NVIDIA's model card:
// "Nemotron-H-8B-Base-8K ... 8B"), 8,192-token pre-training.
TEST(HfImport, NemotronH8bHybrid) {
  const Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/Nemotron-H-8B-Base-8K.json"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelSpec& m = *r;
  EXPECT_EQ(m.layers, 52);
  EXPECT_EQ(m.hybrid_pattern, "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-");
  const LayerCounts n = m.layer_counts(0, m.layers);
  EXPECT_EQ(n[LayerKind::kMamba], 24);
  EXPECT_EQ(n[LayerKind::kAttention], 4);
  EXPECT_EQ(n[LayerKind::kMlp], 24);
  EXPECT_EQ(m.mamba_num_heads, 128);
  EXPECT_EQ(m.mamba_head_dim, 64);
  EXPECT_EQ(m.mamba_num_groups, 8);
  EXPECT_EQ(m.mamba_state_dim, 128);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn_hidden, 21504);
  EXPECT_EQ(m.activation, Activation::kSquaredRelu);
  EXPECT_EQ(m.position, PositionEmbedding::kNone);
  EXPECT_EQ(m.norm, Norm::kRmsNorm);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_FALSE(m.bias);
  EXPECT_FALSE(m.moe());
  EXPECT_EQ(m.seq_len, 8192);
  EXPECT_NEAR(double(m.total_params()) / 1e9, 8.1, 0.1);
}

// Nemotron 3 Nano's shape (the NemotronH MoE config): 23 Mamba, 23 MoE, 6 attention layers;
// 31.6B parameters, 3.6B active with the embeddings (NVIDIA's model card: "31.6B total, ~3.2B
// active (3.6B including embeddings)").
TEST(HfImport, Nemotron3NanoHybridMoe) {
  const std::string nano = R"({"model_type": "nemotron_h", "num_hidden_layers": 52,
      "hidden_size": 2688, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
      "intermediate_size": 1856, "vocab_size": 131072, "max_position_embeddings": 262144,
      "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
      "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
      "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2", "n_routed_experts": 128,
      "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
      "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1,
      "tie_word_embeddings": false, "use_bias": false, "use_conv_bias": true})";
  const Result<ModelSpec> r = ImportHfConfigText(nano, "nano.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->moe_layers(), 23);
  EXPECT_EQ(r->num_experts, 128);
  EXPECT_EQ(r->moe_topk, 6);
  EXPECT_EQ(r->moe_shared_ffn_hidden, 3712);
  EXPECT_EQ(r->moe_router, MoeRouter::kSigmoid);
  EXPECT_EQ(r->kv_channels, 128);
  EXPECT_NEAR(double(r->total_params()) / 1e9, 31.6, 0.1);
  EXPECT_NEAR(double(r->active_params()) / 1e9, 3.6, 0.1);
  EXPECT_EQ(r->seq_len, 4096);  // 262144 is the extended context
  // What Megatron's MambaMixer cannot train, and patterns ptdp cannot read, are refused.
  auto with = [&](const std::string& from, const std::string& to) {
    std::string j = nano;
    j.replace(j.find(from), from.size(), to);
    return ImportError("nano", j);
  };
  EXPECT_THAT(with(R"("conv_kernel": 4)", R"("conv_kernel": 8)"), HasSubstr("key 'conv_kernel' = 8"));
  EXPECT_THAT(with(R"("use_bias": false)", R"("use_bias": true)"), HasSubstr("key 'use_bias' = true"));
  EXPECT_THAT(with(R"("MEMEM*)", R"("MGMEM*)"),
              HasSubstr("has 'G', not a layer symbol ptdp models"));
  EXPECT_THAT(with(R"("MEMEM*)", R"("MEM*)"), HasSubstr("has 50 layers but num_hidden_layers is 52"));
  EXPECT_THAT(with(R"("n_routed_experts": 128,)", ""),
              HasSubstr("has E (MoE) layers but the config gives no experts"));
}

// Nemotron 3 Super: LatentMoE (experts on moe_latent_size 1024) and one MTP depth of
// mtp_hybrid_override_pattern ("*E"): 120.7B weights without MTP (the BF16 release's
// safetensors headers: 123.6B with its 2.94B MTP).
TEST(HfImport, Nemotron3SuperLatentMoeAndMtp) {
  const Result<ModelSpec> r =
      ImportHfConfig(SourcePath("tests/data/hf/NVIDIA-Nemotron-3-Super-120B-A12B.json"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->layers, 88);
  EXPECT_EQ(r->moe_layers(), 40);
  EXPECT_EQ(r->moe_latent_size, 1024);
  EXPECT_EQ(r->moe_width(), 1024);
  EXPECT_EQ(r->mtp_layers, 1);
  EXPECT_EQ(r->mtp_pattern, "*E");
  EXPECT_FALSE(r->mtp_repeated);
  EXPECT_EQ(r->unified_hybrid_pattern().substr(r->unified_hybrid_pattern().size() - 3), "/*E");
  EXPECT_NEAR(double(r->total_params()) / 1e9, 120.67, 0.05);
  EXPECT_NEAR(double(r->mtp_params()) / 1e9, 2.94, 0.01);
  EXPECT_NEAR(double(r->active_params()) / 1e9, 12.8, 0.1);  // card: 12B active
  // Read back from its YAML, the same model.
  auto again = ModelFromYaml(YAML::Load(ModelToYaml(*r, "")), "super.yaml", "");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(ModelToYaml(*again, ""), ModelToYaml(*r, ""));
  // An MTP count without its depth's pattern, or symbols ptdp does not model, are refused.
  std::ifstream in(SourcePath("tests/data/hf/NVIDIA-Nemotron-3-Super-120B-A12B.json"));
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  auto with = [&](const std::string& from, const std::string& to) {
    std::string j = text;
    j.replace(j.find(from), from.size(), to);
    return ImportError("super", j);
  };
  EXPECT_THAT(with(R"("mtp_hybrid_override_pattern": "*E")", R"("mtp_hybrid_override_pattern": "")"),
              HasSubstr("needs the MTP depth's layer pattern"));
  EXPECT_THAT(with(R"("mtp_hybrid_override_pattern": "*E")", R"("mtp_hybrid_override_pattern": "*G")"),
              HasSubstr("has 'G'"));
}

TEST(HfImportRefusals, UnmodelledLayers) {
  Result<ModelSpec> r = ImportHfConfig(SourcePath("tests/data/hf/Qwen3-Next-80B-A3B-Instruct.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'model_type' = \"qwen3_next\""));
  EXPECT_THAT(r.status().message(), HasSubstr("linear-attention"));

  const std::string base = R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 100)";
  EXPECT_THAT(ImportError("hybrid", "{" + base + R"(, "hybrid_override_pattern": "M*M-"})"),
              HasSubstr("key 'hybrid_override_pattern' = \"M*M-\""));
  EXPECT_THAT(ImportError("jamba", R"({"model_type": "jamba", "hidden_size": 64})"),
              HasSubstr("key 'model_type' = \"jamba\": Mamba (state-space) layers"));
  EXPECT_THAT(ImportError("mamba", "{" + base + R"(, "mamba_num_heads": 8})"),
              HasSubstr("key 'mamba_num_heads' = 8"));
  EXPECT_THAT(ImportError("linear", "{" + base + R"(, "layer_types": ["full_attention",
      "linear_attention", "full_attention", "full_attention"]})"),
              HasSubstr("key 'layer_types[1]' = \"linear_attention\""));
  // A wrapper's text_config is scanned too.
  EXPECT_THAT(ImportError("g3-linear", R"({"model_type": "gemma3", "text_config": {
      "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
      "num_hidden_layers": 4, "linear_num_key_heads": 4}})"),
              HasSubstr("key 'text_config.linear_num_key_heads' = 4"));
}

TEST(HfImportRefusals, WhatModelSpecCannotExpress) {
  const std::string moe = R"("model_type": "qwen3_moe", "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 8,
      "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32)";
  EXPECT_EQ(ImportError("moe-ok", "{" + moe + R"(, "mlp_only_layers": []})"), "");
  EXPECT_EQ(ImportError("moe-first", "{" + moe + R"(, "mlp_only_layers": [0, 1]})"), "");
  EXPECT_THAT(ImportError("moe-holes", "{" + moe + R"(, "mlp_only_layers": [3, 7]})"),
              HasSubstr("mlp_only_layers"));
  EXPECT_THAT(ImportError("moe-none", "{" + moe + R"(, "decoder_sparse_step": 9})"),
              HasSubstr("no layer is MoE"));
  EXPECT_THAT(ImportError("router", "{" + moe + R"(, "scoring_func": "sqrtsoftplus"})"),
              HasSubstr("key 'scoring_func' = \"sqrtsoftplus\""));
  const std::string dense = R"("model_type": "qwen2", "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 8,
      "vocab_size": 100)";
  EXPECT_THAT(ImportError("act", "{" + dense + R"(, "hidden_act": "relu"})"),
              HasSubstr("key 'hidden_act' = \"relu\""));
  EXPECT_THAT(ImportError("qwen-swa", "{" + dense + R"(, "use_sliding_window": true,
      "sliding_window": 512, "max_window_layers": 4})"),
              HasSubstr("key 'max_window_layers' = 4"));
  EXPECT_EQ(ImportError("qwen-swa-all", "{" + dense + R"(, "use_sliding_window": true,
      "sliding_window": 512, "max_window_layers": 0})"), "");
  EXPECT_THAT(ImportError("types", "{" + dense + R"(, "sliding_window": 512, "layer_types": [
      "sliding_attention", "full_attention", "full_attention", "sliding_attention",
      "sliding_attention", "full_attention", "sliding_attention", "full_attention"]})"),
              HasSubstr("key 'layer_types'"));
  const std::string unknown = ImportError("bert", R"({"model_type": "bert"})");
  EXPECT_THAT(unknown, HasSubstr("key 'model_type' = \"bert\""));
  EXPECT_THAT(unknown, HasSubstr("supported: llama, mistral, mixtral"));
  EXPECT_THAT(ImportError("no-type", R"({"hidden_size": 64})"), HasSubstr("no key 'model_type'"));
  EXPECT_THAT(ImportError("gemma3-flat", R"({"model_type": "gemma3"})"),
              HasSubstr("needs a text_config"));
}

}  // namespace
}  // namespace ptdp
