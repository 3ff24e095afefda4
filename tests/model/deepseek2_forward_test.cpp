// The deepseek2 forward beyond the fixture references: layouts the fixtures do not cover.
#include "model/deepseek2.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "forwarding_backend.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "runtime/kv_cache.h"
#include "test_support.h"

namespace tandem {
namespace {

// Logits of every position of `tokens` from a fresh cache.
std::vector<float> logits_for(const gguf::GgufFile& file, std::span<const int32_t> tokens) {
  cpu::CpuBackend backend(2);
  Deepseek2Model model(file, backend);
  const auto& hp = model.hparams();
  KvCache cache(backend, model.info().kv, 64, 1, 64);
  std::vector<int32_t> positions, seq_ids(tokens.size(), 0), rows;
  for (size_t i = 0; i < tokens.size(); ++i) positions.push_back(int32_t(i)), rows.push_back(int32_t(i));
  std::vector<float> logits(tokens.size() * hp.n_vocab);
  model.forward({.tokens = tokens, .positions = positions, .seq_ids = seq_ids, .logit_rows = rows},
                cache.views(), logits.data());
  return logits;
}

TEST(Deepseek2Forward, CombinedKvBTensorGivesTheSameLogitsAsSplitKAndV) {
  const auto split = gguf::GgufFile::open(test::fixture("micro-v2-F32.gguf").string());
  const Deepseek2Hparams hp = read_deepseek2_hparams(split);
  const int64_t heads = hp.n_head, nope = hp.qk_nope_dim, v = hp.v_head_dim, lora = hp.kv_lora_rank;

  // Rewrite every layer's attn_k_b / attn_v_b as the older combined attn_kv_b: per head, nope
  // key rows then v_head value rows, each over the latent.
  std::vector<std::vector<float>> combined;
  std::vector<gguf::TensorToWrite> tensors;
  for (const gguf::TensorInfo& t : split.tensors()) {
    if (t.name.ends_with("attn_v_b.weight")) continue;
    if (!t.name.ends_with("attn_k_b.weight")) {
      tensors.push_back({t.name, t.type, t.shape, t.bytes()});
      continue;
    }
    const std::string prefix = t.name.substr(0, t.name.size() - std::string("attn_k_b.weight").size());
    const auto* k_b = reinterpret_cast<const float*>(t.data);  // [H][lora][nope]
    const auto* v_b = reinterpret_cast<const float*>(split.find_tensor(prefix + "attn_v_b.weight")->data);
    std::vector<float>& kv_b = combined.emplace_back(size_t(heads * (nope + v) * lora));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t j = 0; j < lora; ++j) kv_b[size_t(((h * (nope + v)) + i) * lora + j)] = k_b[(h * lora + j) * nope + i];
      for (int64_t i = 0; i < v; ++i)
        for (int64_t j = 0; j < lora; ++j) kv_b[size_t(((h * (nope + v)) + nope + i) * lora + j)] = v_b[(h * v + i) * lora + j];
    }
    tensors.push_back({prefix + "attn_kv_b.weight", DType::F32, {uint64_t(lora), uint64_t(heads * (nope + v))},
                       {reinterpret_cast<const uint8_t*>(kv_b.data()), kv_b.size() * sizeof(float)}});
  }
  const std::string path = (std::filesystem::temp_directory_path() / "tandem-kv-b-combined.gguf").string();
  gguf::write_gguf(path, split.metadata(), tensors);
  const auto old_layout = gguf::GgufFile::open(path);
  ASSERT_EQ(old_layout.find_tensor("blk.1.attn_k_b.weight"), nullptr);

  const std::vector<int32_t> tokens = {0, 671, 645, 1193, 291, 1072, 80, 285};
  const std::vector<float> a = logits_for(split, tokens), b = logits_for(old_layout, tokens);
  ASSERT_EQ(a.size(), b.size());
  float max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
  EXPECT_LT(max_diff, 1e-3f);
  std::filesystem::remove(path);
}

TEST(Deepseek2Forward, PrefillInOneBatchEqualsTokenByToken) {
  const auto file = gguf::GgufFile::open(test::fixture("micro-v3-F32.gguf").string());
  const std::vector<int32_t> tokens = {0, 671, 645, 1193, 291, 1072, 80, 285, 1876, 597};
  const std::vector<float> batched = logits_for(file, tokens);

  cpu::CpuBackend backend(2);
  Deepseek2Model model(file, backend);
  const auto& hp = model.hparams();
  KvCache cache(backend, model.info().kv, 64, 1, 64);
  std::vector<float> logits(hp.n_vocab);
  float max_diff = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = int32_t(i), seq = 0, row = 0;
    model.forward({.tokens = {&tokens[i], 1}, .positions = {&pos, 1}, .seq_ids = {&seq, 1}, .logit_rows = {&row, 1}},
                  cache.views(), logits.data());
    for (size_t k = 0; k < hp.n_vocab; ++k) max_diff = std::max(max_diff, std::abs(logits[k] - batched[i * hp.n_vocab + k]));
  }
  EXPECT_LT(max_diff, 1e-3f);
}

// The activation bits each matmul of a step was given, by weight.
class MatmulBits final : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::pair<const void*, ActivationBits>> seen;
  void matmul(const MatmulOp& op) override {
    seen.emplace_back(op.weight.data, op.activations);
    ForwardingBackend::matmul(op);
  }
};

// The attention projections take the FFNs' bits under a softmax router (small-v2: V2-Lite's
// shape) and 16 under V3's sigmoid group selection (small-v3), and 16 everywhere under int16
// (docs/correctness.md, Precision).
TEST(Deepseek2Forward, AttentionProjectionsTakeTheFfnBitsUnderASoftmaxRouterOnly) {
  struct Case {
    const char* fixture;
    PrecisionPolicy policy;
    ActivationBits expected;
  };
  for (const Case c :
       {Case{"small-v2-Q8_0.gguf", PrecisionPolicy::FfnInt8, ActivationBits::Eight},
        Case{"small-v2-Q8_0.gguf", PrecisionPolicy::Int16, ActivationBits::Sixteen},
        Case{"small-v3-Q8_0.gguf", PrecisionPolicy::FfnInt8, ActivationBits::Sixteen}}) {
    const auto file = gguf::GgufFile::open(test::fixture(c.fixture).string());
    cpu::CpuBackend cpu(2);
    MatmulBits backend(cpu);
    Deepseek2Model model(file, backend);
    model.set_precision(c.policy);
    KvCache cache(backend, model.info().kv, 16, 1, 16);
    const int32_t token = 1, pos = 0, seq = 0, row = 0;
    std::vector<float> logits(model.hparams().n_vocab);
    model.forward({.tokens = {&token, 1},
                   .positions = {&pos, 1},
                   .seq_ids = {&seq, 1},
                   .logit_rows = {&row, 1}},
                  cache.views(), logits.data());
    const std::string name = std::string(c.fixture) + " " + precision_policy_name(c.policy);
    auto bits_of = [&](const std::string& tensor) {
      const gguf::TensorInfo* info = file.find_tensor(tensor);
      const void* data = info ? info->data : nullptr;
      for (const auto& [weight, bits] : backend.seen)
        if (weight == data) return std::optional<ActivationBits>(bits);
      return std::optional<ActivationBits>();
    };
    const bool q_lora = model.hparams().q_lora_rank > 0;
    // (kv_a is q's or q_a's MatmulOp::second: the same op, the same bits.)
    std::vector<std::string> tensors = {"blk.1.attn_output.weight"};
    if (q_lora) {
      tensors.insert(tensors.end(), {"blk.1.attn_q_a.weight", "blk.1.attn_q_b.weight"});
    } else {
      tensors.push_back("blk.1.attn_q.weight");
    }
    for (const std::string& tensor : tensors) {
      const std::optional<ActivationBits> bits = bits_of(tensor);
      ASSERT_TRUE(bits.has_value()) << name << ": no matmul of " << tensor;
      EXPECT_EQ(*bits, c.expected) << name << ": " << tensor;
    }
  }
}

}  // namespace
}  // namespace tandem
