#include "core/backend.h"

#include <unistd.h>

#include "core/error.h"
#include "core/fnv_hash.h"

namespace tandem {

uint64_t device_id_on_this_machine(std::string_view place) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  Fnv1a hash;
  hash.mix_bytes(host);
  hash.mix_bytes("/");
  hash.mix_bytes(place);
  return hash.value();
}

bool Backend::copy_from_peer(Backend&, void*, const void*, size_t) { return false; }

std::unique_ptr<RankChannel> Backend::open_rank_channel(Transport&, int32_t peer, bool,
                                                        std::string_view what) {
  fail("{} has no direct path to rank {}'s devices (for {}): its buffers go through host memory",
       name(), peer, what);
}

bool Backend::copy_to_peer(Backend& to, void* peer_dst, const void* src, size_t bytes) {
  return to.copy_from_peer(*this, peer_dst, src, bytes);
}

void Backend::upload_weights(void* device_dst, const void* host_src, size_t bytes,
                             std::shared_ptr<Event> /*after: earlier in the one stream*/) {
  copy_from_host_async(device_dst, host_src, bytes);
}

void Backend::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  for (const float* part : parts) add(y, part, n);
}

MatmulOp router_product(const MoeRouteOp& route) {
  return MatmulOp{.weight = route.router,
                  .input = route.input,
                  .output = route.logits,
                  .n_tokens = route.n_tokens,
                  .kernels = route.kernels,
                  .bias = route.router_bias};
}

MoeOp shared_experts_moe(const MoeOp& routed) {
  const SharedExpertsOp& s = routed.shared;
  return MoeOp{.input = routed.input,
               .gate = s.gate,
               .up = s.up,
               .down = s.down,
               .expert_ids = s.zero_ids,
               .local_index = nullptr,
               .n_expert = 1,
               .n_tokens = routed.n_tokens,
               .top_k = 1,
               .dim = routed.dim,
               .ffn_dims = s.ffn_dims,
               .slots = s.slot,
               .kernels = routed.kernels,
               .step_tokens = routed.step_tokens,
               .activations = routed.activations};
}

MoeReduceOp shared_experts_reduce(const MoeOp& routed) {
  const SharedExpertsOp& s = routed.shared;
  return MoeReduceOp{.slots = s.slot,
                     .weights = s.one_weights,
                     .n_tokens = routed.n_tokens,
                     .top_k = 1,
                     .dim = routed.dim,
                     .output = s.output};
}

RopeOp query_rope(const MlaAttentionOp& op) {
  TANDEM_CHECK(op.rope.rope_dims == op.cache.rope_dims);  // the queries' rope dims are the keys'
  const int64_t q_row = op.nope_dims + op.cache.rope_dims;
  return {.data = op.q,
          .positions = op.positions,
          .n_tokens = op.n_tokens,
          .n_heads = op.n_heads,
          .head_stride = q_row,
          .token_stride = op.n_heads * q_row,
          .offset = op.nope_dims,
          .params = op.rope};
}

void Backend::store_latent(const LatentStoreOp& op) {
  const int64_t row = op.cache.row();
  TANDEM_CHECK(op.cache.k_dims == 0 && op.cache.kv_lora_rank == op.norm_dims &&
               op.cache.rope_dims == op.rope.rope_dims);
  TANDEM_CHECK(!op.query_lora || (op.query_lora_norm && op.query_lora_dims > 0));
  if (op.query_lora)
    rms_norm({.input = op.query_lora,
              .weight = op.query_lora_norm,
              .output = op.query_lora,
              .n_rows = op.n_tokens,
              .dim = op.query_lora_dims,
              .input_stride = op.query_lora_dims,
              .output_stride = op.query_lora_dims,
              .eps = op.eps});
  rms_norm({.input = op.rows,
            .weight = op.norm_weight,
            .output = op.rows,
            .n_rows = op.n_tokens,
            .dim = op.norm_dims,
            .input_stride = row,
            .output_stride = row,
            .eps = op.eps});
  rope({.data = op.rows,
        .positions = op.positions,
        .n_tokens = op.n_tokens,
        .n_heads = 1,
        .head_stride = row,
        .token_stride = row,
        .offset = op.norm_dims,
        .params = op.rope});
  kv_store({.rows = op.rows,
            .cache = op.cache,
            .positions = op.positions,
            .seq_ids = op.seq_ids,
            .n_tokens = op.n_tokens});
}

// Backends without graphs: the executor asks can_capture() first, so reaching these is a bug.
void Backend::begin_capture() { fail("{}: this device cannot capture a step as a graph", name()); }
std::unique_ptr<Graph> Backend::end_capture() {
  fail("{}: this device cannot capture a step as a graph", name());
}
void Backend::replay(Graph&) { fail("{}: this device cannot replay a graph", name()); }

}  // namespace tandem
