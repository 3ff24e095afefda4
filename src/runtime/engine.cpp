#include "runtime/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cuda/cuda_devices.h"
#include "core/error.h"
#include "core/fnv_hash.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/repack.h"
#include "plan/hardware.h"
#include "runtime/device_setup.h"
#include "runtime/kv_cache.h"
#include "runtime/rank_agreement.h"
#include "runtime/rank_spread.h"
#include "runtime/transport.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

// Which rank runs each part, hashed (FNV-1a over its 32-bit values): ranks that planned alike
// agree on it.
uint64_t rank_plan_fingerprint(const RankPlan& ranks) {
  Fnv1a hash;
  hash.mix(uint32_t(ranks.embeddings));
  hash.mix(uint32_t(ranks.output));
  for (size_t il = 0; il < ranks.layers.size(); ++il) {
    hash.mix(uint32_t(ranks.layers[il]));
    for (int32_t r : ranks.experts[il]) hash.mix(uint32_t(r));
  }
  return hash.value();
}

// What rank 0 tells the following ranks, in a StepHeader.
enum FollowerOp : int32_t {
  kStep = 0,     // a forward pass: its inputs follow
  kStop = 1,     // rank 0's Engine ended
  kProbe = 2,    // ping-pong with rank 1 (measure_rank_link)
  kTraffic = 3,  // gather every rank's transfers and clock (rank_traffic)
  // The server's KV work between steps (body as each function below sends it):
  kPrefixCache = 4,  // enable_prefix_cache: the budget's low and high 32 bits
  kRestore = 5,      // restore_prefix: limit, seq, tokens
  kStore = 6,        // store_prefix: seq, tokens
  kCopy = 7,         // copy_sequence: from, to, length
  kRouting = 8,      // gather every rank's expert choices (gather_routing)
};

// A following rank waits this long for rank 0's next step: rank 0 may sit idle between requests
// (a rank that dies is ended by mpirun, which ends the run).
constexpr double kIdleWaitSeconds = 7 * 24 * 3600.0;
// While loading, a rank waits this long for the others (reading a model from a cold disk).
constexpr double kLoadWaitSeconds = 3600.0;

}  // namespace

Engine::Engine(const EngineOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Spread spread = options.spread.empty() ? Spread::Pipeline : parse_spread(options.spread);
  if (!options.cluster.empty()) {
    if (!options.spread.empty() && spread != Spread::Plan)
      fail(
          "--cluster {} plans where every part runs, and --spread {} divides the model without a "
          "plan: give one or the other",
          options.cluster, options.spread);
    spread = Spread::Plan;
  }
  rank_timeout_s_ = options.rank_timeout_s;
  rank_failure_grace_s_ = options.rank_failure_grace_s;
  if (!options.alone) transport_ = open_transport({.timeout_s = options.rank_timeout_s});
  if (!transport_ || transport_->n_ranks() == 1) {
    transport_.reset();
    if (!options.spread.empty())
      fail(
          "--spread {} divides a model between the ranks of `mpirun -np N tandem ...`; this "
          "process runs alone",
          options.spread);
    if (!options.cluster.empty())
      fail(
          "--cluster {0} plans a run over MPI ranks, one per machine it lists: start it with "
          "`mpirun -np N tandem ...` (`tandem plan MODEL --cluster {0}` shows the plan)",
          options.cluster);
  }
  // Loading waits on the other ranks (the file check, the context): as long as a load may take.
  if (transport_) transport_->set_timeout(kLoadWaitSeconds);
  try {
    load(options, spread, start);
  } catch (const std::exception& e) {
    // Every rank waits on this one: end the run with its error rather than leave them waiting.
    if (transport_) transport_->abort_run(e.what());
    throw;
  }
}

// --repack: the model's repacked copy (model/repack.h) in place of the file, made first if need
// be; --repack-in-memory: made in RAM at every load. Each rank keeps its own machine's copy (the
// ranks compared the models themselves already).
void Engine::use_repacked_copy(bool in_memory) {
  const std::string model_path = file_->name();
  if (cpu::best_cpu_isa() != cpu::CpuIsa::Avx512) {
    if (rank() == 0)
      std::fprintf(stderr,
                   "tandem: --repack: this CPU has no AVX-512, where the interleaved kernels run "
                   "slower than the file's own; running %s as it is\n",
                   model_path.c_str());
    return;
  }
  RepackedCopy copy = in_memory
                          ? repacked_in_memory(*file_, n_threads_, /*show_progress=*/rank() == 0)
                          : repacked_copy(*file_, n_threads_, /*show_progress=*/rank() == 0);
  if (!copy.file) return;  // repacked already
  if (in_memory)
    std::fprintf(stderr,
                 "tandem: --repack-in-memory: repacked %s in RAM (%d of %d tensors interleaved, "
                 "%s) in %.1f s\n",
                 model_path.c_str(), copy.summary.n_interleaved, copy.summary.n_tensors,
                 format_bytes(copy.summary.file_bytes).c_str(), copy.summary.seconds);
  else if (copy.made)
    std::fprintf(stderr,
                 "tandem: --repack: wrote %s (%d of %d tensors interleaved, %s) in %.1f s; later "
                 "runs load it directly\n",
                 copy.path.c_str(), copy.summary.n_interleaved, copy.summary.n_tensors,
                 format_bytes(copy.summary.file_bytes).c_str(), copy.summary.seconds);
  else if (rank() == 0)
    std::fprintf(stderr, "tandem: --repack: loading %s, the repacked copy of %s\n",
                 copy.path.c_str(), model_path.c_str());
  file_ = std::move(copy.file);  // the file it checked, whatever replaces that path meanwhile
  repacked_memory_ = std::move(copy.memory);
}

void Engine::load(const EngineOptions& options, Spread spread,
                  std::chrono::steady_clock::time_point start) {
  if (options.cache_type_v != options.cache_type_k)
    fail(
        "--cache-type-k {} and --cache-type-v {}: tandem keeps keys and values in one type (an "
        "MLA cache row is both); give both the same",
        dtype_info(options.cache_type_k).name, dtype_info(options.cache_type_v).name);
  file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(options.model_path));
  if (transport_)
    check_same_on_every_rank(*transport_, file_->header_fingerprint(),
                             fmt::format("{}'s size and header", options.model_path),
                             "every machine must hold the same file");
  const ModelInfo file_info = read_model_info(*file_);  // refuses an unknown architecture

  n_threads_ = options.n_threads > 0 ? options.n_threads : physical_core_count();
  if (options.repack && options.repack_in_memory)
    fail(
        "--repack and --repack-in-memory: choose one (a copy in a file, reused, or in RAM, made "
        "at every load)");
  if (options.repack || options.repack_in_memory) use_repacked_copy(options.repack_in_memory);
  int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : int64_t(file_info.n_ctx_train);
  DevicePlan devices;
  // "auto" on a machine without GPUs is a CPU run, without planning.
  const std::string device_spec = options.devices == "auto" && cuda::count_gpus() == 0 ? "cpu" : options.devices;
  const bool cpu_only = device_spec.empty() || device_spec == "cpu";
  // Over ranks that all have devices, the plan over as many machines like theirs places every
  // part, unless --spread says otherwise. Ranks of CPUs alone take a pipeline: planned with the
  // RAM a run may take (no limit: the mapped file's pages), one machine's CPU would hold every
  // layer. A cluster file, or --spread plan, plans them (the file's RAM where it gives one).
  if (transport_ && options.spread.empty() && options.cluster.empty())
    spread = default_spread(*transport_, cpu_only);
  spread_ = spread;
  const bool plan_ranks = transport_ && spread == Spread::Plan;
  std::optional<RankPlan> planned_ranks;
  if (cpu_only && !plan_ranks) {
    backends_.push_back(std::make_unique<cpu::CpuBackend>(n_threads_, "cpu", options.pin_threads));
    devices = DevicePlan::single(*backends_[0], file_info.n_layer, file_info.n_expert);
  } else {
    // Devices with budgets need a real context length to plan the KV cache.
    if (options.n_ctx <= 0 && n_ctx > 4096) {
      if (rank() == 0)  // every rank chooses the same
        std::fprintf(
            stderr,
            "tandem: context %d tokens (the model's is %lld) to plan the devices' memory; set "
            "--ctx to choose\n",
            4096, (long long)n_ctx);
      n_ctx = 4096;
    }
    std::function<void(plan::Hardware&)> agree;
    if (plan_ranks) agree = [&](plan::Hardware& hw) { agree_on_hardware(*transport_, hw); };
    std::optional<plan::Hardware> cluster;
    if (!options.cluster.empty())
      cluster = cluster_of_ranks(*transport_, options.cluster, n_threads_);
    const std::string machines =
        cluster ? fmt::format("the {} machines of {}", n_ranks(), options.cluster)
                : fmt::format("{} machines like this one", n_ranks());
    DeviceSetup setup =
        setup_devices(*file_, device_spec, options.rules, options.profile, n_threads_,
                      {.n_ctx = n_ctx,
                       .n_parallel = options.n_seq,
                       .prefill_batch = 512,
                       .cache_type = options.cache_type_k},
                      options.pin_threads, plan_ranks ? n_ranks() : 1, rank(), agree,
                      cluster ? &*cluster : nullptr);
    backends_ = std::move(setup.backends);
    devices = setup.plan;
    if (options.stream_experts >= 0) devices.stream_experts_min_tokens = options.stream_experts;
    stream_experts_min_tokens_ = devices.stream_experts_min_tokens;
    if (plan_ranks) {
      planned_ranks = setup.ranks;
      // Each rank planned alone from the same numbers: only other flags can make them differ.
      check_same_on_every_rank(
          *transport_, rank_plan_fingerprint(setup.ranks),
          "the plan over the ranks (each rank plans alone)",
          "give every rank the same --rules, --profile and --ctx, or --spread pipeline, experts "
          "or mixed");
      if (const std::vector<int32_t> idle = ranks_without_parts(setup.ranks, n_ranks());
          !idle.empty())
        fail(
            "the plan over {} (--devices {}) puts nothing on rank(s) {}: "
            "the cost model predicts the model faster on fewer machines' devices (or in rank "
            "0's RAM; `tandem plan MODEL {}` shows why). Run on fewer ranks, pin parts "
            "to other machines' devices or RAM with --rules (device: node1:cuda:0, node1:cpu), or "
            "give --spread "
            "pipeline, experts or mixed to divide it anyway",
            machines, device_spec, fmt::join(idle, ", "),
            cluster ? "--cluster " + options.cluster : fmt::format("--nodes {}", n_ranks()));
    }
    placement_ = std::move(setup.placement);
    if (options.verbose && (rank() == 0 || !plan_ranks))  // --spread plan: all plan alike
      std::fprintf(stderr, "tandem: placement on %s:\n%s", device_spec.c_str(),
                   setup.summary.c_str());
    if (plan_ranks && rank() == 0)
      for (const plan::Candidate& c : placement_->candidates)
        if (c.chosen)
          std::fprintf(stderr,
                       "tandem: over %d ranks as planned for %s: %s, predicted %.2f tokens/s "
                       "decode (cost model; --verbose: the placement)\n",
                       n_ranks(), machines.c_str(), c.name.c_str(),
                       c.predicted.decode_tokens_per_s);
  }
  if (transport_) {
    RankPlan ranks = planned_ranks ? *planned_ranks
                                   : spread_over_ranks(spread, file_info, transport_->n_ranks());
    ranks.transport = transport_.get();
    keep_parts_of_rank(devices, ranks, transport_->rank());
    rank_plan_ = ranks;
    // Steps overlap where the spread lets them; in a plan over machines, only where the cost model
    // found it faster (a stage that holds most of every step would make each group's step cost
    // nearly the whole batch's).
    steps_in_flight_ = overlapping_stages(ranks);
    if (planned_ranks && placement_)
      steps_in_flight_ = std::min(steps_in_flight_, placement_->predicted.overlapping_steps);
    if (options.verbose)
      std::fprintf(stderr, "tandem: rank %d of %d (%s), model spread as %s\n", rank(), n_ranks(),
                   transport_->describe().c_str(), std::string(spread_name(spread)).c_str());
    // Without NCCL each cut between GPUs of two ranks costs a copy out and a copy in: said once.
    const bool has_gpu = std::ranges::any_of(
        devices.layers, [](const Backend* d) { return d && d->name().starts_with("cuda:"); });
    if (transport_->n_ranks() > 1 && has_gpu && !cuda::nccl_loaded())
      std::fprintf(stderr, "tandem: rank %d: %s\n", rank(), cuda::describe_nccl().c_str());
  }
  // Before the weights load: every device that keeps a layer's cache, or a copy of it for its
  // share of the heads, must take the cache's type.
  for (size_t il = 0; il < devices.layers.size(); ++il) {
    std::vector<const Backend*> holders = {devices.layers[il]};
    if (il < devices.heads.size())
      for (const AttentionShare& share : devices.heads[il]) holders.push_back(share.device);
    for (const Backend* d : holders)
      if (d && !d->can_cache(options.cache_type_k))
        fail(
            "a {} KV cache runs on the CPU only, and layer {}'s attention is on {}: use "
            "--cache-type-k f32 --cache-type-v f32, or --devices cpu",
            dtype_info(options.cache_type_k).name, il, d->name());
  }
  model_ = load_model(*file_, devices);
  model_->set_graphs_enabled(options.graphs);
  model_->set_precision(options.precision);
  // The interleaved formats of `tandem repack` have fast kernels on AVX-512 only; elsewhere each
  // 16-row group is taken apart into plain rows at every use.
  if (cpu::best_cpu_isa() != cpu::CpuIsa::Avx512) {
    for (const gguf::TensorInfo& t : file_->tensors()) {
      if (!is_interleaved(t.type)) continue;
      std::fprintf(stderr, "tandem: note: this model was rewritten by `tandem repack` for AVX-512 CPUs; "
                   "with the %s kernels of this CPU it runs slower than the file it was made from\n",
                   std::string(cpu::cpu_isa_name(cpu::best_cpu_isa())).c_str());
      break;
    }
  }
  if (options.mlock && repacked_memory_)
    std::fprintf(stderr,
                 "tandem: warning: --mlock locks files; the --repack-in-memory copy is not "
                 "locked and may be paged out under memory pressure\n");
  if (options.mlock) {
    // As llama.cpp: a lock that fails is a warning, the run goes on from the page cache.
    if (std::string error = file_->lock_in_memory(/*show_progress=*/true); !error.empty())
      std::fprintf(stderr, "tandem: warning: --mlock: cannot lock the model in RAM (%s); it may be "
                   "paged out under memory pressure. Raise the limit (`ulimit -l unlimited`, or "
                   "LimitMEMLOCK=infinity for a systemd service) or run without --mlock\n", error.c_str());
  } else {
    // A cold start reads while it computes; the reading starts before anything else that takes
    // time (mapping the cached pages, building the tokenizer: 55 ms of a cold start of the lite
    // model), so the disk works during those too.
    model_->start_reading_weights();
    const size_t mapped = file_->map_cached_pages();
    const size_t huge = file_->huge_mapped_bytes();
    if (options.verbose)
      std::fprintf(stderr, "tandem: %s of the model in the page cache mapped up front, %s of it on "
                   "2 MiB pages\n", format_bytes(mapped).c_str(), format_bytes(huge).c_str());
    // The page cache keeps a file's pages in the sizes it first read them in. Cached in 4 KiB
    // pieces (written by a download, read before tandem asked for large pages, or broken up by
    // memory pressure), the weights cost a page-table entry per 4 KiB: measured 11 instead of
    // 16-18 tokens/s on the lite model on a VM with none on 2 MiB pages, and such pages stream
    // 15-20% slower (docs/performance.md). Re-reading the file fixes it; say how.
    if (mapped >= (size_t(1) << 30) && huge > 0 && huge < mapped / 10 * 9)
      std::fprintf(
          stderr,
          "tandem: note: only %s of the %s of this model in the page cache is on 2 MiB "
          "pages; the rest streams 15-20%% slower (decode up to 1.5x slower with none). To "
          "re-read it in large pages: stop tandem, run `dd if=%s iflag=nocache count=0` "
          "(drops it from the cache), then start again\n",
          format_bytes(huge).c_str(), format_bytes(mapped).c_str(), file_->name().c_str());
  }
  model_->finish_loading(/*show_progress=*/true);  // GPUs fill while the disk reads ahead for the CPU
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  const ModelInfo& info = model_->info();

  const std::span<const KvLayerShape> kv_layers = info.kv;
  const DType cache_type = options.cache_type_k;  // and _v: load() checked they match
  // (Over several ranks: when a layer of this rank keeps its cache in RAM; the ranks then take
  // the smallest context any of them chose.)
  const bool cache_in_ram = std::ranges::any_of(
      devices.layers, [&](const Backend* d) { return d == backends_[0].get(); });
  if (options.n_ctx <= 0 && cache_in_ram) {
    // Default: the model's context, but never more cache than half the free memory.
    const uint64_t budget = plan::available_ram_bytes() / 2;
    auto bytes = [&](int64_t ctx) {
      return KvCache::bytes_per_sequence(kv_layers, ctx, kMaxStepTokens, cache_type) *
             uint64_t(options.n_seq);
    };
    if (budget && bytes(n_ctx) > budget) {
      int64_t fits = 256;  // window layers make the cost per token uneven: halve until it fits
      for (int64_t ctx = n_ctx; ctx >= 256; ctx /= 2)
        if (bytes(ctx) <= budget) {
          fits = ctx;
          break;
        }
      n_ctx = fits;
      std::fprintf(stderr,
                   "tandem: context capped at %lld tokens (of %u) to keep the KV cache "
                   "within half of free memory; set --ctx to choose\n",
                   (long long)n_ctx, info.n_ctx_train);
    }
  }
  if (transport_) {  // every rank keeps the same context: the smallest any of them chose
    n_ctx = std::ranges::min(gather_from_every_rank(*transport_, n_ctx, "the context length"));
  }
  cache_ = std::make_unique<KvCache>(devices.layers, kv_layers, n_ctx, options.n_seq,
                                     kMaxStepTokens, cache_type);
  const uint64_t per_token =
      KvCache::bytes_per_sequence(kv_layers, n_ctx, kMaxStepTokens, cache_type) / uint64_t(n_ctx);
  load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.verbose)
    std::fprintf(stderr,
                 "tandem: loaded %s: %s of weights, %u layers, %s KV cache %s for %lld "
                 "tokens (%s per token), %d threads, %.2f s\n",
                 file_->name().c_str(), format_bytes(model_->weight_bytes()).c_str(),
                 model_->n_layers(), std::string(dtype_info(cache_type).name).c_str(),
                 format_bytes(cache_->bytes()).c_str(), (long long)n_ctx,
                 format_bytes(per_token).c_str(), n_threads_, load_seconds_);
}

// The model first: it waits for work still queued on the devices, which writes the KV cache.
Engine::~Engine() {
  // Steps still in flight are finished first: their logits are on the way.
  std::vector<float> unused;
  while (!in_flight_.empty() && rank_failure_.empty()) {
    try {
      finish_batch(in_flight_.front().id, unused);
    } catch (const std::exception&) {
    }
  }
  // A failed run ends before anything is freed: a send that timed out may still read its bytes.
  if (!rank_failure_.empty()) transport_->abort_run(rank_failure_);
  if (transport_ && rank() == 0) {
    try {
      announce(kStop);
    } catch (const std::exception& e) {
      transport_->abort_run(e.what());  // the others would wait for a step that never comes
    }
  }
  model_.reset();
}

void Engine::announce(int32_t op, std::span<const int32_t> body) {
  if (!rank_failure_.empty()) return;  // the run is ending: no one follows any more
  // Members, not locals: a send that timed out may read them until the run ends.
  announced_ = {.op = op, .n_tokens = int32_t(body.size())};
  announced_body_.assign(body.begin(), body.end());
  send_announcement("the next step");
}

void Engine::send_announcement(std::string_view what) {
  const Transport::Traffic before = transport_->traffic();
  for (int32_t r = 1; r < n_ranks(); ++r) {
    transport_->send(r, std::as_bytes(std::span(&announced_, 1)), what);
    if (!announced_body_.empty())
      transport_->send(r, std::as_bytes(std::span(announced_body_)), what);
  }
  const Transport::Traffic& after = transport_->traffic();
  announced_traffic_.messages += after.messages - before.messages;
  announced_traffic_.bytes += after.bytes - before.bytes;
  announced_traffic_.transfer_s += after.transfer_s - before.transfer_s;
}

void Engine::enable_prefix_cache(uint64_t budget_bytes) {
  if (transport_ && rank() == 0)
    announce(kPrefixCache,
             std::array{int32_t(uint32_t(budget_bytes)), int32_t(uint32_t(budget_bytes >> 32))});
  prefix_cache_ = budget_bytes > 0 ? std::make_unique<PrefixCache>(*cache_, budget_bytes) : nullptr;
}

int64_t Engine::restore_prefix(std::span<const int32_t> tokens, int64_t limit, int32_t seq) {
  TANDEM_CHECK(prefix_cache_);
  if (transport_ && rank() == 0) {
    std::vector<int32_t> body{int32_t(limit), seq};
    body.insert(body.end(), tokens.begin(), tokens.end());
    announce(kRestore, body);
  }
  return prefix_cache_->restore(tokens, limit, seq);
}

void Engine::store_prefix(std::span<const int32_t> tokens, int32_t seq) {
  TANDEM_CHECK(prefix_cache_);
  if (transport_ && rank() == 0) {
    std::vector<int32_t> body{seq};
    body.insert(body.end(), tokens.begin(), tokens.end());
    announce(kStore, body);
  }
  prefix_cache_->store(tokens, seq);
}

PrefixCache::Stats Engine::prefix_cache_stats() const {
  return prefix_cache_ ? prefix_cache_->stats() : PrefixCache::Stats{};
}

void Engine::copy_sequence(int32_t from, int32_t to, int64_t length) {
  if (transport_ && rank() == 0) announce(kCopy, std::array{from, to, int32_t(length)});
  cache_->copy_sequence(from, to, length);
}

Engine::RankLink Engine::measure_rank_link() {
  // Not between a step's start and finish: a pending receive of logits would take the pong.
  TANDEM_CHECK(transport_ && rank() == 0 && in_flight_.empty());
  announce(kProbe);
  return ping_pong();
}

std::vector<Engine::RankTraffic> Engine::rank_traffic() {
  TANDEM_CHECK(transport_ && rank() == 0);
  const Transport::Traffic before = transport_->traffic();
  const Transport::Traffic announced_before = announced_traffic_;
  announce(kTraffic);
  transport_->traffic_reset(before);  // asking is not the run's traffic
  announced_traffic_ = announced_before;
  return gather_traffic();
}

// Rank 0 and rank 1 bounce a small message, then a large one, back and forth; the other ranks
// wait. The probe's own messages are not counted as traffic.
Engine::RankLink Engine::ping_pong() {
  RankLink link;
  if (rank() > 1) return link;
  const Transport::Traffic before = transport_->traffic();
  const int32_t peer = 1 - rank();
  auto bounce = [&](std::vector<std::byte>& message, int rounds) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (rank() == 0) transport_->send(peer, message, "a probe of the link");
      transport_->receive(peer, message, "a probe of the link");
      if (rank() == 1) transport_->send(peer, message, "a probe of the link");
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           (2.0 * rounds);
  };
  std::vector<std::byte> small(8), large(size_t(4) << 20);
  bounce(small, 20);  // warm-up
  link.latency_s = bounce(small, 200);
  const double one_way = bounce(large, 8);
  link.bytes_per_s = double(large.size()) / std::max(one_way - link.latency_s, 1e-9);
  transport_->traffic_reset(before);
  return link;
}

std::vector<Engine::RankTraffic> Engine::gather_traffic() {
  const RankTraffic mine{
      .traffic = transport_->traffic(),
      .announced = announced_traffic_,
      .clock_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                     .count()};
  return gather_from_every_rank(*transport_, mine, "every rank's transfers");
}

int32_t Engine::rank() const {
  return transport_ ? transport_->rank() : 0;
}
int32_t Engine::n_ranks() const {
  return transport_ ? transport_->n_ranks() : 1;
}

void Engine::announce_step(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                           std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                           KernelChoice kernels) {
  announced_ = {.op = kStep,
                .n_tokens = int32_t(tokens.size()),
                .n_rows = int32_t(logit_rows.size()),
                .kernels = int32_t(kernels)};
  std::vector<int32_t>& body = announced_body_;  // a member: see announce()
  body.assign(tokens.begin(), tokens.end());
  body.insert(body.end(), positions.begin(), positions.end());
  body.insert(body.end(), seq_ids.begin(), seq_ids.end());
  body.insert(body.end(), logit_rows.begin(), logit_rows.end());
  send_announcement(fmt::format("step {}'s inputs", steps_));
}

void Engine::follow() {
  TANDEM_CHECK(transport_ && rank() != 0);
  std::vector<int32_t> body;
  std::vector<float> logits;
  try {
    for (;;) {
      StepHeader header;
      transport_->set_timeout(kIdleWaitSeconds);
      transport_->receive(0, std::as_writable_bytes(std::span(&header, 1)), "the next step");
      transport_->set_timeout(rank_timeout_s_);
      if (header.op == kStop) return;
      if (header.op == kProbe) {
        ping_pong();
        continue;
      }
      if (header.op == kTraffic) {
        gather_traffic();
        continue;
      }
      if (header.op == kRouting) {
        gather_routing();
        continue;
      }
      if (header.op != kStep) {  // the server's KV work: its arguments follow
        body.resize(size_t(header.n_tokens));
        if (!body.empty())
          transport_->receive(0, std::as_writable_bytes(std::span(body)), "the next step");
        const std::span<const int32_t> args(body);
        if (header.op == kPrefixCache)
          enable_prefix_cache(uint64_t(uint32_t(args[0])) | uint64_t(uint32_t(args[1])) << 32);
        else if (header.op == kRestore)
          restore_prefix(args.subspan(2), args[0], args[1]);
        else if (header.op == kStore)
          store_prefix(args.subspan(1), args[0]);
        else if (header.op == kCopy)
          copy_sequence(args[0], args[1], args[2]);
        else
          fail(
              "rank 0 asked for step kind {}, which this rank does not know: the ranks run "
              "different builds of tandem",
              header.op);
        continue;
      }
      const size_t T = size_t(header.n_tokens), R = size_t(header.n_rows);
      body.resize(3 * T + R);
      transport_->receive(0, std::as_writable_bytes(std::span(body)),
                          fmt::format("step {}'s inputs", steps_));
      const std::span<const int32_t> all(body);
      evaluate_batch(all.subspan(0, T), all.subspan(T, T), all.subspan(2 * T, T),
                     all.subspan(3 * T, R), KernelChoice(header.kernels), logits);
    }
  } catch (const std::exception& e) {
    transport_->abort_run(e.what());  // it names the step
    throw;
  }
}

const ModelInfo& Engine::info() const {
  return model_->info();
}

plan::RoutingProfile Engine::routing_profile() {
  plan::RoutingProfile profile{.model = std::filesystem::path(file_->name()).filename().string()};
  if (transport_) {
    TANDEM_CHECK(rank() == 0);
    if (!rank_failure_.empty())
      fail("the run over {} ranks has ended: {}", n_ranks(), rank_failure_);
    announce(kRouting);
    profile.counts = gather_routing().counts;
  } else {
    profile.counts = model_->routing_counts();
  }
  return profile;
}

std::vector<std::pair<std::string, uint64_t>> Engine::routing_counts_by_device() {
  // A run over ranks that failed is ending: the others may not answer a gather, and a server still
  // tells its clients meanwhile. This rank's own counts then.
  if (!transport_ || !rank_failure_.empty()) return choices_by_device(model_->routing_counts(), "");
  TANDEM_CHECK(rank() == 0);
  announce(kRouting);
  return gather_routing().by_device;
}

std::vector<std::pair<std::string, uint64_t>> Engine::choices_by_device(
    const std::vector<std::vector<uint64_t>>& counts, const std::string& prefix) const {
  std::vector<std::pair<std::string, uint64_t>> totals;
  for (const auto& backend : backends_) totals.emplace_back(prefix + backend->name(), 0);
  const DevicePlan& plan = model_->devices();
  for (size_t layer = 0; layer < counts.size() && layer < plan.experts.size(); ++layer)
    for (size_t e = 0; e < counts[layer].size() && e < plan.experts[layer].size(); ++e)
      for (size_t b = 0; b < backends_.size(); ++b)
        if (backends_[b].get() == plan.experts[layer][e]) totals[b].second += counts[layer][e];
  return totals;
}

// Each MoE layer is routed, and counted, on the rank that runs it, and each expert is held by one
// rank: so the counts are summed over the ranks (a row per layer, and whether the rank counted
// it), and each rank sums them by its own devices.
Engine::RoutingTally Engine::gather_routing() {
  const ModelInfo& info = model_->info();
  const size_t n_layer = info.n_layer, n_expert = info.n_expert, row = n_expert + 1;
  const std::vector<std::vector<uint64_t>> mine = model_->routing_counts();
  std::vector<uint64_t> sent(n_layer * row, 0);
  for (size_t il = 0; il < n_layer && il < mine.size(); ++il)
    if (mine[il].size() == n_expert) {
      std::copy(mine[il].begin(), mine[il].end(), sent.begin() + il * row);
      sent[il * row + n_expert] = 1;
    }
  std::vector<uint64_t> all(sent.size() * size_t(n_ranks()));
  transport_->all_gather(std::as_bytes(std::span(sent)), std::as_writable_bytes(std::span(all)),
                         "every rank's expert choices");
  RoutingTally tally;
  tally.counts.resize(n_layer);
  for (int32_t r = 0; r < n_ranks(); ++r)
    for (size_t il = 0; il < n_layer; ++il) {
      const uint64_t* from = all.data() + size_t(r) * sent.size() + il * row;
      if (!from[n_expert]) continue;
      tally.counts[il].resize(n_expert, 0);
      for (size_t e = 0; e < n_expert; ++e) tally.counts[il][e] += from[e];
    }

  struct DeviceChoices {
    char name[48];
    uint64_t count;
  };
  const std::string prefix = rank() == 0 ? "" : fmt::format("node{}:", rank());
  std::vector<DeviceChoices> totals;
  for (const auto& [name, count] : choices_by_device(tally.counts, prefix)) {
    DeviceChoices entry{};
    std::snprintf(entry.name, sizeof entry.name, "%s", name.c_str());
    entry.count = count;
    totals.push_back(entry);
  }
  const std::vector<int32_t> sizes =
      gather_from_every_rank(*transport_, int32_t(totals.size()), "every rank's device count");
  const size_t most = size_t(*std::ranges::max_element(sizes));
  totals.resize(most, DeviceChoices{});
  std::vector<DeviceChoices> every(most * size_t(n_ranks()));
  transport_->all_gather(std::as_bytes(std::span(totals)), std::as_writable_bytes(std::span(every)),
                         "every rank's expert choices by device");
  for (const DeviceChoices& entry : every)
    if (entry.name[0]) tally.by_device.emplace_back(entry.name, entry.count);
  return tally;
}

std::vector<std::string> Engine::device_names() const {
  std::vector<std::string> names;
  for (const auto& backend : backends_) names.push_back(backend->name());
  return names;
}

std::vector<gguf::FileRange> Engine::touched_file_ranges() const { return model_->touched_file_ranges(); }

int64_t Engine::n_vocab() const {
  return model_->info().n_vocab;
}
int64_t Engine::n_ctx() const { return cache_->n_ctx(); }
uint64_t Engine::kv_cache_bytes() const { return cache_->bytes(); }
uint64_t Engine::weight_bytes() const { return model_->weight_bytes(); }

void Engine::evaluate(std::span<const int32_t> tokens, int32_t start, int32_t seq, bool all_logits,
                      std::vector<float>& logits) {
  const int64_t n = int64_t(tokens.size());
  if (start < 0 || start + n > cache_->n_ctx())
    fail("{} tokens at position {} pass the context of {} tokens; raise --ctx or shorten the input",
         n, start, cache_->n_ctx());
  positions_.resize(size_t(n));
  seq_ids_.assign(size_t(n), seq);
  for (int64_t i = 0; i < n; ++i) positions_[size_t(i)] = start + int32_t(i);
  logit_rows_.clear();
  // Over several ranks long prompts go in steps too: each rank's wait for the others is then a
  // step's, not the whole prompt's (--rank-timeout).
  if ((!cache_->has_rings() && !transport_) || n <= kMaxStepTokens) {
    for (int64_t i = all_logits ? 0 : n - 1; i < n; ++i) logit_rows_.push_back(int32_t(i));
    evaluate_batch(tokens, positions_, seq_ids_, logit_rows_, KernelChoice::ByTokenCount, logits);
    return;
  }
  // A window layer's ring holds the window and one step's tokens: longer inputs go in steps.
  std::vector<float> step_logits;
  logits.clear();
  for (int64_t first = 0; first < n; first += kMaxStepTokens) {
    const int64_t count = std::min(kMaxStepTokens, n - first);
    logit_rows_.clear();
    for (int64_t i = all_logits ? 0 : count - 1; i < count; ++i) logit_rows_.push_back(int32_t(i));
    if (!all_logits && first + count < n) logit_rows_.clear();
    evaluate_batch(tokens.subspan(size_t(first), size_t(count)),
                   std::span<const int32_t>(positions_).subspan(size_t(first), size_t(count)),
                   std::span<const int32_t>(seq_ids_).subspan(size_t(first), size_t(count)),
                   logit_rows_, KernelChoice::ByTokenCount, step_logits);
    logits.insert(logits.end(), step_logits.begin(), step_logits.end());
  }
}

void Engine::evaluate_batch(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                            std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                            KernelChoice kernels, std::vector<float>& logits) {
  finish_batch(start_batch(tokens, positions, seq_ids, logit_rows, kernels), logits);
}

uint64_t Engine::start_batch(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                             std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                             KernelChoice kernels) {
  TANDEM_CHECK(positions.size() == tokens.size() && seq_ids.size() == tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (positions[i] < 0 || positions[i] >= cache_->n_ctx())
      fail("position {} is outside the context of {} tokens; raise --ctx or shorten the input",
           positions[i], cache_->n_ctx());
    if (seq_ids[i] < 0 || seq_ids[i] >= cache_->n_seq())
      fail("sequence {} is outside 0..{}", seq_ids[i], cache_->n_seq() - 1);
  }
  for (int32_t row : logit_rows) TANDEM_CHECK(row >= 0 && size_t(row) < tokens.size());
  if (cache_->has_rings()) {
    // Each sequence's tokens in this step, at most kMaxStepTokens (a ring's slack).
    std::vector<std::pair<int32_t, int64_t>> per_seq;
    for (int32_t seq : seq_ids) {
      auto it = std::find_if(per_seq.begin(), per_seq.end(),
                             [&](const auto& e) { return e.first == seq; });
      if (it == per_seq.end())
        per_seq.emplace_back(seq, 1);
      else if (++it->second > kMaxStepTokens)
        fail(
            "a step holds more than {} tokens of sequence {}; this model's sliding-window layers "
            "keep only that many beside their window: evaluate in smaller steps",
            kMaxStepTokens, seq);
    }
  }
  StepInFlight& step = in_flight_.emplace_back();
  step.id = ++started_;
  step.logits = std::move(spare_logits_);
  step.logits.resize(logit_rows.size() * size_t(n_vocab()));
  const Batch batch{.tokens = tokens,
                    .positions = positions,
                    .seq_ids = seq_ids,
                    .logit_rows = logit_rows,
                    .kernels = kernels};
  try {
    if (!transport_) {
      model_->forward(batch, cache_->views(), step.logits.data());
      return step.id;
    }
    over_ranks([&] {
      if (rank() == 0) announce_step(tokens, positions, seq_ids, logit_rows, kernels);
      transport_->set_timeout(rank_timeout_s_);
      model_->forward(batch, cache_->views(), step.logits.data(),
                      steps_in_flight_ > 1 && rank() == 0 ? &step.arriving : nullptr);
    });
  } catch (...) {
    // A logits' receive left pending may still write into its buffer until the run ends.
    if (in_flight_.back().arriving) failed_steps_.push_back(std::move(in_flight_.back()));
    in_flight_.pop_back();
    throw;
  }
  ++steps_;
  return step.id;
}

void Engine::finish_batch(uint64_t step, std::vector<float>& logits) {
  TANDEM_CHECK(!in_flight_.empty() && in_flight_.front().id == step);
  StepInFlight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (oldest.arriving) {
    try {
      over_ranks([&] { oldest.arriving->wait(); });
    } catch (...) {
      failed_steps_.push_back(std::move(oldest));  // its receive may be pending still
      throw;
    }
  }
  std::swap(logits, oldest.logits);
  spare_logits_ = std::move(oldest.logits);
}

// Over several ranks every rank runs the step; one that fails ends them all (the others would
// wait on it), naming the step: at once, or on rank 0 after the grace a server takes to tell its
// clients.
void Engine::over_ranks(const std::function<void()>& part) {
  if (!rank_failure_.empty()) fail("the run over {} ranks has ended: {}", n_ranks(), rank_failure_);
  try {
    part();
  } catch (const std::exception& e) {
    rank_failure_ = e.what();  // what crosses ranks names its step
    if (rank() != 0 || rank_failure_grace_s_ <= 0) transport_->abort_run(rank_failure_);
    std::thread([transport = transport_.get(), why = rank_failure_, grace = rank_failure_grace_s_] {
      std::this_thread::sleep_for(std::chrono::duration<double>(grace));
      transport->abort_run(why);
    }).detach();
    throw;
  }
}

int64_t Engine::n_seq() const { return cache_->n_seq(); }

int64_t Engine::earliest_rewind(int64_t length) const {
  return cache_->earliest_rewind(length);
}

}  // namespace tandem
