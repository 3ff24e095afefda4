#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem::plan {

const DeviceKindCost& CostParams::of(DeviceKind kind) const {
  switch (kind) {
    case DeviceKind::Cpu:
      return cpu;
    case DeviceKind::Cuda:
      return cuda;
    case DeviceKind::Sim:
      return sim;
  }
  return cpu;
}

double expected_distinct_experts(uint32_t n_expert, uint32_t n_used, int64_t batch) {
  if (n_expert == 0 || batch <= 0) return 0;
  const double p = std::min(1.0, double(n_used) / double(n_expert));
  return double(n_expert) * (1.0 - std::pow(1.0 - p, double(batch)));
}

double expected_distinct_experts(const std::vector<double>& choice_probability, int64_t batch) {
  double sum = 0;
  for (double p : choice_probability)
    sum += 1.0 - std::pow(1.0 - std::clamp(p, 0.0, 1.0), double(std::max<int64_t>(batch, 0)));
  return sum;
}

std::vector<double> expert_choice_probabilities(const ModelInventory& inventory,
                                                const RoutingProfile* profile, uint32_t layer) {
  const Deepseek2Hparams& hp = inventory.hparams;
  const double uniform = hp.n_expert ? double(hp.n_expert_used) / double(hp.n_expert) : 0.0;
  std::vector<double> p(hp.n_expert, uniform);
  if (!profile || layer >= profile->counts.size()) return p;
  const std::vector<uint64_t>& counts = profile->counts[layer];
  if (counts.size() != hp.n_expert) return p;
  double total = 0;
  for (uint64_t c : counts) total += double(c);
  if (total <= 0) return p;
  // Each token makes n_expert_used choices, so tokens seen = total / k and p_e = k * c_e / total.
  for (size_t e = 0; e < counts.size(); ++e)
    p[e] = std::min(1.0, double(hp.n_expert_used) * double(counts[e]) / total);
  return p;
}

double group_flops_per_token(const Deepseek2Hparams& hp, const InventoryGroup& group) {
  const double d = hp.n_embd;
  switch (group.kind) {
    case WeightGroup::Attention: {
      const double q = hp.q_lora_rank ? d * hp.q_lora_rank +
                                            double(hp.q_lora_rank) * hp.n_head * hp.qk_head_dim()
                                      : d * hp.n_head * hp.qk_head_dim();
      const double kv_a = d * (hp.kv_lora_rank + hp.qk_rope_dim);
      const double kv_b = double(hp.kv_lora_rank) * hp.n_head * (hp.qk_nope_dim + hp.v_head_dim);
      const double out = double(hp.n_head) * hp.v_head_dim * d;
      return 2 * (q + kv_a + kv_b + out);
    }
    case WeightGroup::Router:
      return 2 * d * hp.n_expert;
    case WeightGroup::SharedExperts:
      return 2 * 3 * d * hp.n_ff_expert * hp.n_expert_shared;
    case WeightGroup::DenseFfn:
      return 2 * 3 * d * hp.n_ff_dense;
    case WeightGroup::RoutedExperts:
      return 2 * 3 * d * hp.n_ff_expert;
    case WeightGroup::OutputHead:
      return 2 * d * hp.n_vocab;
    default:
      return 0;  // embeddings are a row copy; norms are negligible
  }
}

namespace {

double total(const Prediction& t) {
  return t.decode_seconds_gpu + t.decode_seconds_cpu + t.decode_seconds_transfer +
         t.decode_seconds_disk;
}

// One step of `batch` tokens: what it reads and computes, and how long that takes where.
struct StepShape {
  int64_t batch = 1;          // tokens in the step
  double context = 0;         // tokens each of them attends to
  double kv_tokens_read = 0;  // KV rows read from the cache in the whole step
  int64_t logit_rows = 1;     // rows the output head computes
};

class StepModel {
 public:
  StepModel(const ModelInventory& inv, const Hardware& hw, const Placement& placement,
            const RoutingProfile* profile, const CostParams& params)
      : inv_(inv), hw_(hw), placement_(placement), params_(params) {
    TANDEM_CHECK(placement.group_device.size() == inv.groups.size());
    TANDEM_CHECK(placement.layer_device.size() == inv.n_layers);
    layers_.resize(inv.n_layers);
    for (size_t i = 0; i < inv.groups.size(); ++i) {
      const InventoryGroup& g = inv.groups[i];
      if (g.layer >= 0 && uint32_t(g.layer) < inv.n_layers)
        layers_[size_t(g.layer)].push_back(i);
      else if (g.kind == WeightGroup::OutputHead)
        output_ = int64_t(i);
      else if (g.kind == WeightGroup::Embedding)
        embedding_ = int64_t(i);
    }
    for (uint32_t l = 0; l < inv.n_layers; ++l)
      choice_.push_back(expert_choice_probabilities(inv, profile, l));
  }

  // Seconds for one step, split by where the critical path spends them.
  Prediction step_seconds(const StepShape& s) const {
    Prediction t;
    const Deepseek2Hparams& hp = inv_.hparams;
    const double activation_bytes = double(s.batch) * hp.n_embd * 4;  // F32 hidden state
    int32_t prev =
        compute_device(embedding_ >= 0 ? placement_.group_device[size_t(embedding_)] : 0);
    for (uint32_t l = 0; l < inv_.n_layers; ++l) {
      const int32_t owner = compute_device(placement_.layer_device[l]);
      if (owner != prev) t.decode_seconds_transfer += transfer_s(prev, owner, activation_bytes);
      prev = owner;

      // Attention block on the owner: weights, KV rows, and the attention itself (absorbed
      // MLA: scores over kv_lora + rope dims, output over kv_lora dims, per head).
      Part attn;
      attn.bytes += double(inv_.kv_bytes_per_token_per_layer) * s.kv_tokens_read;
      attn.flops +=
          2.0 * hp.n_head * (2.0 * hp.kv_lora_rank + hp.qk_rope_dim) * s.context * double(s.batch);
      attn.ops = params_.attention_ops;
      // The FFN block, per device that holds a part of it (index into placement_.devices).
      std::vector<Part> ffn(placement_.devices.size());
      for (size_t gi : layers_[l]) {
        const InventoryGroup& g = inv_.groups[gi];
        const int32_t where = placement_.group_device[gi];
        const int32_t dev = compute_device(where);
        const double flops = group_flops_per_token(hp, g);
        if (g.kind == WeightGroup::RoutedExperts) {
          const double p = g.expert >= 0 && size_t(g.expert) < choice_[l].size()
                               ? choice_[l][size_t(g.expert)]
                               : 0;
          const double touched = 1.0 - std::pow(1.0 - p, double(s.batch));
          Part& part = ffn[size_t(dev)];
          if (where == kOnDisk) part.disk_bytes += touched * double(g.bytes);
          else part.bytes += touched * kernel_bytes(g, dev);
          part.flops += flops * p * double(s.batch);
          part.ops = params_.ffn_ops;
        } else if (g.kind == WeightGroup::Attention || g.kind == WeightGroup::Router ||
                   g.kind == WeightGroup::Norms) {
          // Read on the layer's device; a group pinned elsewhere costs a round trip.
          attn.bytes += kernel_bytes(g, owner);
          attn.flops += flops * double(s.batch);
          if (dev != owner) attn.extra_s += 2 * transfer_s(owner, dev, activation_bytes);
        } else {
          Part& part = ffn[size_t(dev)];
          if (where == kOnDisk) part.disk_bytes += double(g.bytes);
          else part.bytes += kernel_bytes(g, dev);
          part.flops += flops * double(s.batch);
          part.ops = params_.ffn_ops;
        }
      }
      add_to(t, owner, seconds(owner, attn));

      // The FFN parts run at the same time; the layer waits for the slowest one. Parts away
      // from the owner pay the hidden state there and the partial sum back, and a sync.
      // Simulated devices compute on the host's cores, so their parts and the host's take turns
      // rather than overlap: they count as one part.
      double slowest = 0;
      Prediction slowest_split, on_host_cores;
      for (size_t d = 0; d < ffn.size(); ++d) {
        const Part& part = ffn[d];
        if (part.ops == 0) continue;
        Prediction split;
        add_to(split, int32_t(d), seconds(int32_t(d), part) - disk_s(part));
        split.decode_seconds_disk += disk_s(part);
        if (int32_t(d) != owner)
          split.decode_seconds_transfer +=
              2 * transfer_s(owner, int32_t(d), activation_bytes) + params_.sync_s;
        if (spec(int32_t(d)).kind != DeviceKind::Cuda) {
          on_host_cores.decode_seconds_cpu += split.decode_seconds_cpu;
          on_host_cores.decode_seconds_transfer += split.decode_seconds_transfer;
          on_host_cores.decode_seconds_disk += split.decode_seconds_disk;
          split = on_host_cores;
        }
        if (total(split) > slowest) slowest = total(split), slowest_split = split;
      }
      t.decode_seconds_gpu += slowest_split.decode_seconds_gpu;
      t.decode_seconds_cpu += slowest_split.decode_seconds_cpu;
      t.decode_seconds_transfer += slowest_split.decode_seconds_transfer;
      t.decode_seconds_disk += slowest_split.decode_seconds_disk;
    }
    if (output_ >= 0) {
      const InventoryGroup& g = inv_.groups[size_t(output_)];
      const int32_t where = placement_.group_device[size_t(output_)];
      const int32_t dev = compute_device(where);
      if (dev != prev)
        t.decode_seconds_transfer += transfer_s(prev, dev, double(s.logit_rows) * hp.n_embd * 4);
      Part head{.bytes = where == kOnDisk ? 0 : kernel_bytes(g, dev),
                .disk_bytes = where == kOnDisk ? double(g.bytes) : 0,
                .flops = group_flops_per_token(hp, g) * double(s.logit_rows),
                .ops = 2};
      add_to(t, dev, seconds(dev, head) - disk_s(head));
      t.decode_seconds_disk += disk_s(head);
    }
    return t;
  }

 private:
  struct Part {
    double bytes = 0;       // read from the device's memory
    double disk_bytes = 0;  // read from the file first
    double flops = 0;
    int ops = 0;
    double extra_s = 0;  // transfers the part needs on its own
  };

  // Groups streamed from disk are computed by the host.
  static int32_t compute_device(int32_t where) { return where == kOnDisk ? 0 : where; }

  const DeviceSpec& spec(int32_t dev) const { return placement_.devices[size_t(dev)].spec; }

  // Weight bytes per second the device's kernels read: measured on the host where known (our
  // decode kernel, not the memory bus, is the limit on a few cores), else a share of the spec.
  double bandwidth(int32_t dev) const {
    const DeviceKindCost& k = params_.of(spec(dev).kind);
    if (spec(dev).decode_kernel_bytes_per_s > 0)
      return spec(dev).decode_kernel_bytes_per_s * k.kernel_efficiency;
    const double bw = spec(dev).bandwidth_bytes_per_s > 0 ? spec(dev).bandwidth_bytes_per_s
                                                          : k.fallback_bandwidth_bytes_per_s;
    return bw * k.bandwidth_efficiency;
  }
  // A group's bytes as the device's measured decode kernels see them (hardware.h).
  double kernel_bytes(const InventoryGroup& g, int32_t dev) const {
    return kernel_equivalent_bytes(spec(dev), double(g.bytes), double(g.interleaved_bytes));
  }
  double flops(int32_t dev) const {
    const DeviceKindCost& k = params_.of(spec(dev).kind);
    const double f = spec(dev).flops_per_s > 0 ? spec(dev).flops_per_s : k.fallback_flops_per_s;
    return f * k.flops_efficiency;
  }
  double disk_s(const Part& part) const {
    return part.disk_bytes / (std::max(hw_.disk_bytes_per_s, 1e6) * params_.disk_efficiency);
  }
  // Roofline: a part is bound by bytes or by FLOPs, whichever is slower; disk reads come first.
  double seconds(int32_t dev, const Part& part) const {
    return std::max((part.bytes + part.disk_bytes) / bandwidth(dev), part.flops / flops(dev)) +
           part.ops * params_.of(spec(dev).kind).op_overhead_s + part.extra_s + disk_s(part);
  }
  double transfer_s(int32_t from, int32_t to, double bytes) const {
    if (from == to) return 0;
    const bool over_pcie = spec(from).kind == DeviceKind::Cuda || spec(to).kind == DeviceKind::Cuda;
    // sim devices live in host memory: their copies are memcpy at host speed.
    const double rate =
        over_pcie ? hw_.host_to_device_bytes_per_s * params_.transfer_efficiency : bandwidth(0);
    return params_.transfer_latency_s + bytes / std::max(rate, 1e6);
  }
  void add_to(Prediction& t, int32_t dev, double s) const {
    (spec(dev).kind == DeviceKind::Cuda ? t.decode_seconds_gpu : t.decode_seconds_cpu) += s;
  }

  const ModelInventory& inv_;
  const Hardware& hw_;
  const Placement& placement_;
  const CostParams& params_;
  std::vector<std::vector<size_t>> layers_;  // group indices per layer
  std::vector<std::vector<double>> choice_;  // per layer, per expert: P(token chooses it)
  int64_t output_ = -1, embedding_ = -1;
};

}  // namespace

Prediction predict_speed(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Placement& placement,
                         const RoutingProfile* profile, const CostParams& params) {
  const StepModel model(inventory, hardware, placement, profile, params);
  const double context = params.context_fill * double(std::max<int64_t>(workload.n_ctx, 1));
  const int64_t n_seq = std::max<int64_t>(workload.n_parallel, 1);
  // Decode: every sequence adds one token and reads its own KV rows.
  Prediction decode = model.step_seconds({.batch = n_seq,
                                          .context = context,
                                          .kv_tokens_read = context * double(n_seq),
                                          .logit_rows = n_seq});
  // Prefill: one sequence's batch; its tokens share the KV rows they read, and only the last
  // token's logits are needed.
  const int64_t batch = std::max<int64_t>(workload.prefill_batch, 1);
  const Prediction prefill = model.step_seconds({.batch = batch,
                                                 .context = context,
                                                 .kv_tokens_read = context + double(batch),
                                                 .logit_rows = 1});
  decode.decode_tokens_per_s = double(n_seq) / std::max(total(decode), 1e-12);
  decode.prefill_tokens_per_s = double(batch) / std::max(total(prefill), 1e-12);
  return decode;
}

}  // namespace tandem::plan
