// moe-bench: prompt-processing (pp) and token-generation (tg) throughput like llama-bench. pp
// evaluates one batch of -p random token ids from an empty cache; tg decodes -n random token ids
// one at a time from an empty cache, as llama-bench does (a greedy chain can settle into a loop
// whose few experts an expert cache learns, which real text does not offer). Each test runs once to
// warm up, then -r times; the table shows the median and standard deviation of tokens/second.
// -npl 1,2,4,8 measures decoding several sequences together, as llama-batched-bench: each of N
// sequences first evaluates its own -p random tokens (all N in one batch), then -n steps decode one
// token of every sequence per forward; the table shows the aggregate tokens/second of both.
// --experts process computes the routed experts in a moe-cpu-worker process instead of in-process,
// so both paths can be compared on the same model and threads.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/gpu/gpu_cli.h"
#include "coordinator/gpu/model_factory.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/model/op_profile.h"
#include "coordinator/model/speculative.h"
#include "coordinator/tools/expert_prediction.h"
#include "coordinator/tools/kv_cli.h"
#include "coordinator/tools/llama_cli_args.h"
#include "coordinator/tools/spec_cli.h"
#include "experts/remote_expert_executor.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_prefetch.h"

namespace {

using namespace moe::model;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  int64_t n_prompt = 512, n_gen = 128;
  std::vector<int64_t> depths = {0};  // -d: tokens already in the cache before each test
  std::vector<int64_t> parallel;      // -npl: sequences decoded together (empty: one, as ever)
  int64_t n_ctx = 0;                  // -c: the cache's length (0: what the tests need)
  int threads = 0;
  int reps = 5;
  std::string output = "md";
  moe::tools::KvArgs kv;
  std::string experts = "inproc";  // inproc | process
  int worker_threads = 0;          // 0: as --threads
  std::string worker_bin;          // empty: moe-cpu-worker next to this executable
  int pool_spin = moe::cpu::ThreadPool::kDefaultSpin;  // both processes' pools
  bool op_profile = false;         // --op-profile: per-op times of the CPU forward
  moe::tools::SpecArgs spec;       // --spec-type: greedy decode with and without drafts
  bool spec_drafts_fail = false;   // --spec-drafts-fail: random drafts of --draft-max ids
  double spec_drafts_accept = -1;  // --spec-drafts-accept P: the greedy run's tokens, kept w.p. P
  bool expert_prediction = false;  // --expert-prediction: the table instead of timings
  moe::gpu::GpuOptions gpu;
};

struct Result {
  std::string test;
  int64_t n_prompt = 0, n_gen = 0, depth = 0;
  std::vector<double> samples_ts;
  double median = 0, mean = 0, stddev = 0;
  std::string ops;  // --op-profile's table of the timed runs
  // tg: the hand-off waits over the timed runs (ms; from the expert runtime's counters)
  double gpu_route_wait_ms = 0, cpu_route_wait_ms = 0;
};

void summarize(Result& r) {
  std::vector<double> s = r.samples_ts;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  r.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  double sum = 0;
  for (double x : s) sum += x;
  r.mean = sum / static_cast<double>(n);
  double sq = 0;
  for (double x : s) sq += (x - r.mean) * (x - r.mean);
  r.stddev = n > 1 ? std::sqrt(sq / static_cast<double>(n - 1)) : 0.0;  // sample sd, as llama-bench
}

// AnonHugePages of this process in MiB ("?" where the kernel does not say).
std::string anon_huge_mib() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  uint64_t kb = 0;
  while (in >> key) {
    if (key == "AnonHugePages:" && in >> kb) return std::to_string(kb / 1024);
  }
  return "?";
}

std::string format_params(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull)
    std::snprintf(buf, sizeof buf, "%.2f B", static_cast<double>(n) / 1e9);
  else if (n >= 1000000ull)
    std::snprintf(buf, sizeof buf, "%.2f M", static_cast<double>(n) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f K", static_cast<double>(n) / 1e3);
  return buf;
}

int worker_threads(const Args& a, int threads) {
  return a.worker_threads > 0 ? a.worker_threads : threads;
}

// The expert worker process, sized so that the pp batch goes in one request.
std::unique_ptr<ExpertExecutor> start_worker(const Args& a, const moe::gguf::GgufFile& file,
                                             int threads, bool share_cores) {
  const ModelConfig cfg = ModelConfig::from_gguf(file);
  RemoteExpertOptions o;
  o.worker_bin =
      a.worker_bin.empty()
          ? (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "moe-cpu-worker")
                .string()
          : a.worker_bin;
  o.model_path = a.model;
  o.n_embd = cfg.n_embd;
  o.threads = worker_threads(a, threads);
  o.max_tokens = std::clamp<int64_t>(a.n_prompt, 1, 4096);
  o.max_items = o.max_tokens * cfg.n_expert_used;
  // Both sides idle while the other works; with cores of their own they may spin as long as
  // the pools do, sharing cores they must sleep at once.
  o.pool_spin = a.pool_spin;
  o.spin = share_cores ? 0 : static_cast<uint32_t>(std::max(a.pool_spin, 2000));
  return std::make_unique<RemoteExpertExecutor>(o);
}

// pp and tg at every depth, llama-bench's way: a warm-up, then `reps` timed repetitions.
// prof (null: none) is active during the timed forwards only, and tabled per test.
std::vector<Result> measure(ModelArch& model, KvCache& cache, const Args& a, OpProfile* prof) {
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  std::mt19937 rng(1234);  // fixed seed: the same token ids every run
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(model.config().n_vocab) - 1);

  std::vector<Result> results;
  // llama-bench's depth: the cache holds `depth` tokens (evaluated untimed, in batches of 512)
  // before each timed repetition. As llama-bench does, the first fill at a depth is kept (a
  // checkpoint, which a hybrid model's recurrent state needs) and later repetitions go back to it.
  int64_t kept_depth = -1;
  const auto fill = [&](int64_t depth) {
    if (depth == kept_depth && model.restore_checkpoint(cache)) return;
    cache.clear();
    kept_depth = -1;
    std::vector<int32_t> chunk;
    for (int64_t done = 0; done < depth; done += static_cast<int64_t>(chunk.size())) {
      chunk.resize(static_cast<size_t>(std::min<int64_t>(512, depth - done)));
      for (auto& tok : chunk) tok = dist(rng);
      model.forward(chunk, cache, LogitsMode::Last, logits.data());
    }
    if (depth > 0) {
      model.save_checkpoint(cache);
      kept_depth = depth;
    }
  };
  const auto suffix = [](int64_t depth) {
    return depth > 0 ? " @ d" + std::to_string(depth) : std::string();
  };
  for (const int64_t depth : a.depths) {
    if (a.n_prompt > 0) {
      Result r{
          "pp" + std::to_string(a.n_prompt) + suffix(depth), a.n_prompt, 0, depth, {}, 0, 0, 0};
      std::vector<int32_t> tokens(static_cast<size_t>(a.n_prompt));
      for (auto& t : tokens) t = dist(rng);
      for (int rep = -1; rep < a.reps; ++rep) {  // rep -1: warm-up
        fill(depth);
        if (prof) prof->set_active(rep >= 0);
        const auto t0 = Clock::now();
        model.forward(tokens, cache, LogitsMode::Last, logits.data());
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (prof) prof->set_active(false);
        if (rep >= 0) r.samples_ts.push_back(static_cast<double>(a.n_prompt) / s);
      }
      summarize(r);
      if (prof) {
        r.ops = prof->table();
        prof->reset();
      }
      results.push_back(std::move(r));
    }
    if (a.n_gen > 0) {
      Result r{"tg" + std::to_string(a.n_gen) + suffix(depth), 0, a.n_gen, depth, {}, 0, 0, 0};
      for (int rep = -1; rep < a.reps; ++rep) {
        fill(depth);
        if (prof) prof->set_active(rep >= 0);
        const auto before = model.expert_runtime();
        const auto t0 = Clock::now();
        for (int64_t i = 0; i < a.n_gen; ++i) {
          const int32_t tok = dist(rng);  // new ids in every repetition too
          model.forward(std::span<const int32_t>(&tok, 1), cache, LogitsMode::Last, logits.data());
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (prof) prof->set_active(false);
        if (rep >= 0) r.samples_ts.push_back(static_cast<double>(a.n_gen) / s);
        if (const auto after = model.expert_runtime(); before && after && rep >= 0) {
          r.gpu_route_wait_ms += after->gpu_route_wait_ms - before->gpu_route_wait_ms;
          r.cpu_route_wait_ms += after->cpu_route_wait_ms - before->cpu_route_wait_ms;
        }
      }
      summarize(r);
      if (prof) {
        r.ops = prof->table();
        prof->reset();
      }
      results.push_back(std::move(r));
    }
  }
  return results;
}

// --spec-type: greedy decoding of -n tokens after a prompt of -p random ids (at least one): without
// drafts, with every draft verified whole, and with the cost model choosing the lengths
// (DraftPolicy, fresh each run); each a warm-up and -r timed runs, decode time from the first
// chosen token on. A greedy chain over random weights tends to settle into a loop, which the
// n-gram lookup then drafts well: the rows show the mechanism's speed at the acceptance printed.
// --spec-drafts-fail drafts --draft-max random ids at every step instead: drafts that fail, whose
// verification the cost model must stop paying for. --spec-drafts-accept P drafts what the greedy
// run chose next, each token kept with probability P (else a wrong id): drafts accepted at a
// chosen rate, for the mechanism's gain at that rate (random weights draft nothing real).
std::vector<Result> measure_speculative(ModelArch& model, KvCache& cache, const Args& a) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(model.config().n_vocab) - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(std::max<int64_t>(1, a.n_prompt)));
  for (auto& t : prompt) t = dist(rng);
  Drafter drafter = moe::tools::make_drafter(a.spec, model, cache.n_ctx());
  if (a.spec_drafts_fail) {
    drafter = [&rng, dist, n = a.spec.ngram.draft_max](std::span<const int32_t>) mutable {
      std::vector<int32_t> draft(static_cast<size_t>(n));
      for (auto& t : draft) t = dist(rng);
      return draft;
    };
  }
  enum class Mode { Plain, Whole, Priced };
  std::vector<Result> results;
  std::vector<int32_t> plain_tokens;  // the greedy run's, drafted from by --spec-drafts-accept
  if (a.spec_drafts_accept >= 0) {
    drafter = [&rng, dist, &plain_tokens, n_prompt = prompt.size(), n = a.spec.ngram.draft_max,
               keep = std::bernoulli_distribution(a.spec_drafts_accept)](
                  std::span<const int32_t> history) mutable {
      std::vector<int32_t> draft;
      for (size_t at = history.size() - n_prompt;
           at < plain_tokens.size() && draft.size() < static_cast<size_t>(n); ++at) {
        int32_t t = plain_tokens[at];
        if (!keep(rng)) {
          const int32_t right = t;
          while (t == right) t = dist(rng);
        }
        draft.push_back(t);
      }
      return draft;
    };
  }
  for (const Mode mode : {Mode::Plain, Mode::Whole, Mode::Priced}) {
    const std::string name = "tg" + std::to_string(a.n_gen) +
                             (mode == Mode::Plain   ? " greedy"
                              : mode == Mode::Whole ? " spec " + a.spec.type
                                                    : " spec " + a.spec.type + " priced");
    Result r{name, 0, a.n_gen, 0, {}, 0, 0, 0};
    SpeculativeStats st;  // the last run's (generate_speculative sets it)
    std::optional<DraftPolicy> policy;
    std::vector<int32_t> tokens;
    for (int rep = -1; rep < a.reps; ++rep) {  // rep -1: warm-up
      cache.clear();
      policy.emplace(a.spec.ngram.draft_max);  // fresh each run: it learns during the run
      GenerateOptions opt;
      opt.n_steps = a.n_gen;
      Clock::time_point t0{};
      opt.on_token = [&](int32_t) {
        if (t0 == Clock::time_point{}) t0 = Clock::now();
        return true;
      };
      const GenerateResult res =
          mode == Mode::Plain ? generate(model, cache, prompt, opt)
                              : generate_speculative(model, cache, prompt, opt, drafter, &st,
                                                     mode == Mode::Priced ? &*policy : nullptr);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep >= 0) r.samples_ts.push_back(static_cast<double>(a.n_gen - 1) / s);
      tokens = res.tokens;
    }
    if (mode == Mode::Plain) {
      plain_tokens = tokens;
    } else {
      // The last run's counts.
      const int64_t forwards = a.n_gen - 1 - st.accepted;  // every accepted draft saved one
      std::fprintf(
          stderr,
          "moe-bench: %s: %s, %.2f tokens per forward; the same tokens as without "
          "drafts: %s\n",
          name.c_str(), describe(st).c_str(),
          static_cast<double>(a.n_gen - 1) / static_cast<double>(std::max<int64_t>(1, forwards)),
          tokens == plain_tokens ? "yes" : "no");
    }
    if (mode == Mode::Priced) {
      // The cost model's terms at the end of the last run.
      std::fprintf(stderr,
                   "moe-bench: %s: cost model: acceptance %.2f; a step of 1 / 2 / %d tokens %.3f / "
                   "%.3f / %.3f ms; it would now verify %d of %d drafted tokens\n",
                   name.c_str(), policy->acceptance(), a.spec.ngram.draft_max + 1,
                   policy->step_seconds(1) * 1e3, policy->step_seconds(2) * 1e3,
                   policy->step_seconds(a.spec.ngram.draft_max + 1) * 1e3,
                   policy->length(a.spec.ngram.draft_max), a.spec.ngram.draft_max);
    }
    summarize(r);
    results.push_back(std::move(r));
  }
  return results;
}

// -npl: for each N, N sequences evaluate -p tokens each in one batch (pp), then decode -n tokens
// each, one forward per step over all N (tg); aggregate tokens/second, llama-batched-bench's S_PP
// and S_TG.
std::vector<Result> measure_parallel(ModelArch& model, const Args& a, int64_t n_ctx) {
  const auto n_vocab = static_cast<size_t>(model.config().n_vocab);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(n_vocab) - 1);
  std::vector<Result> results;
  for (const int64_t n_seq : a.parallel) {
    std::vector<KvCache> caches;
    for (int64_t i = 0; i < n_seq; ++i) {
      caches.push_back(model.make_cache(n_ctx, moe::tools::kv_config(a.kv)));
    }
    std::vector<float> logits(static_cast<size_t>(n_seq) * n_vocab);
    const std::string x = " x" + std::to_string(n_seq);
    Result pp{"pp" + std::to_string(a.n_prompt) + x, a.n_prompt, 0, 0, {}, 0, 0, 0};
    Result tg{"tg" + std::to_string(a.n_gen) + x, 0, a.n_gen, 0, {}, 0, 0, 0};
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(n_seq));
    std::vector<SequenceChunk> chunks(static_cast<size_t>(n_seq));
    for (int rep = -1; rep < a.reps; ++rep) {  // rep -1: warm-up
      for (int64_t i = 0; i < n_seq; ++i) {
        auto& t = tokens[static_cast<size_t>(i)];
        t.resize(static_cast<size_t>(std::max<int64_t>(1, a.n_prompt)));
        for (auto& id : t) id = dist(rng);
        caches[static_cast<size_t>(i)].clear();
        chunks[static_cast<size_t>(i)] = {t, &caches[static_cast<size_t>(i)]};
      }
      auto t0 = Clock::now();
      model.forward_batch(chunks, logits.data());
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep >= 0 && a.n_prompt > 0) {
        pp.samples_ts.push_back(static_cast<double>(n_seq * a.n_prompt) / s);
      }
      t0 = Clock::now();
      for (int64_t step = 0; step < a.n_gen; ++step) {
        for (int64_t i = 0; i < n_seq; ++i) {
          auto& t = tokens[static_cast<size_t>(i)];
          t.assign(1, dist(rng));
          chunks[static_cast<size_t>(i)].tokens = t;
        }
        model.forward_batch(chunks, logits.data());
      }
      s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep >= 0 && a.n_gen > 0) {
        tg.samples_ts.push_back(static_cast<double>(n_seq * a.n_gen) / s);
      }
    }
    for (Result* r : {&pp, &tg}) {
      if (r->samples_ts.empty()) continue;
      summarize(*r);
      results.push_back(std::move(*r));
    }
  }
  return results;
}

int run(const Args& a) {
  OpProfile prof;  // before the model, which keeps a pointer to it
  const auto file = moe::gpu::open_model(a.gpu, a.model, "moe-bench");
  if (file.loaded()) {
    std::fprintf(stderr, "moe-bench: model read into memory, %s MiB of it in huge pages\n",
                 anon_huge_mib().c_str());
  }
  const int threads = a.threads > 0
                          ? a.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The worker starts before the thread pool and the model: before anything heavy.
  // With more threads than cores, a side that spins on the ring while waiting takes a core from
  // the side that works (measured on 2 cores: spinning lost ~25% of tg on a tiny model), so both
  // sides sleep at once. (Making the thread pools sleep at once too was slower: their dispatches
  // then pay a futex wake each.)
  const bool share_cores =
      a.experts == "process" &&
      threads + worker_threads(a, threads) > static_cast<int>(std::thread::hardware_concurrency());
  std::unique_ptr<ExpertExecutor> experts;
  if (a.experts == "process") experts = start_worker(a, file, threads, share_cores);
  moe::cpu::ThreadPool pool(moe::gpu::cpu_pool_threads(a.gpu, threads), {}, a.pool_spin);
  moe::gpu::GpuOptions gpu = a.gpu;
  const int64_t max_depth = *std::max_element(a.depths.begin(), a.depths.end());
  gpu.n_ctx = std::max<int64_t>(1, max_depth + a.n_prompt + a.n_gen);
  if (!a.parallel.empty()) {
    gpu.n_seq = *std::max_element(a.parallel.begin(), a.parallel.end());
    gpu.n_ctx = std::max<int64_t>(1, a.n_prompt) + a.n_gen;
  }
  if (a.n_ctx > 0) {
    if (a.n_ctx < gpu.n_ctx) {
      throw moe::Error("-c " + std::to_string(a.n_ctx) + " is shorter than the " +
                       std::to_string(gpu.n_ctx) + " positions the tests need");
    }
    gpu.n_ctx = a.n_ctx;
  }
  gpu.kv = moe::tools::kv_config(a.kv);
  std::string placement;
  auto model = moe::gpu::create_model(file, pool, std::move(experts), gpu, &placement);
  std::fprintf(stderr, "moe-bench: %s\n", placement.c_str());
  std::fprintf(stderr, "moe-bench: KV cache: %s\n",
               KvCache(model->config(), gpu.n_ctx, gpu.kv, KvStorage::None).describe().c_str());
  const std::string backend = a.gpu.n_gpu_layers > 0 ? "CUDA" : "CPU";
  uint64_t bytes = 0, params = 0;
  for (const auto& t : file.tensors()) {
    bytes += t.n_bytes;
    params += static_cast<uint64_t>(t.n_elements());
  }
  const int64_t n_ctx = gpu.n_ctx;
  OpProfile* profp = nullptr;
  if (a.op_profile) {
    if (model->set_op_profile(&prof)) {
      profp = &prof;
    } else {
      std::fprintf(stderr,
                   "moe-bench: --op-profile: this forward has no per-op profile (CPU "
                   "forwards only: -ngl 0)\n");
    }
  }
  if (a.expert_prediction) {
    // Not a timing: how well layer l+1's experts are named from layer l (the -p random ids).
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> dist(0,
                                                static_cast<int32_t>(model->config().n_vocab) - 1);
    std::vector<int32_t> ids(static_cast<size_t>(a.n_prompt));
    for (auto& t : ids) t = dist(rng);
    const auto rows = moe::tools::measure_expert_prediction(*model, file, ids);
    const moe::model::ModelConfig& c = model->config();
    std::printf("%s", moe::tools::prediction_table(rows, c.n_expert_used, c.n_expert).c_str());
    return 0;
  }
  std::vector<Result> results;
  if (a.spec.type != "none") {
    KvCache cache = model->make_cache(n_ctx, moe::tools::kv_config(a.kv));
    results = measure_speculative(*model, cache, a);
  } else if (a.parallel.empty()) {
    KvCache cache = model->make_cache(n_ctx, moe::tools::kv_config(a.kv));
    results = measure(*model, cache, a, profp);
  } else {
    results = measure_parallel(*model, a, n_ctx);
  }

  if (const std::string st = model->runtime_stats(); !st.empty()) {
    std::fprintf(stderr, "moe-bench: %s\n", st.c_str());
  }
  // In-process CPU GEMVs only: a moe-cpu-worker process measures its own.
  std::fprintf(stderr, "moe-bench: CPU weight prefetch distance: %s\n",
               moe::cpu::prefetch_summary().c_str());
  // Decode results against the physical bound (reference/performance.md §1, measured rates).
  if (const auto rt = model->expert_runtime()) {
    for (const Result& r : results) {
      if (r.n_gen == 0) continue;
      if (const std::string d = describe_against_bound(r.median, *rt); !d.empty()) {
        std::fprintf(stderr, "moe-bench: %s: %s\n", r.test.c_str(), d.c_str());
      }
    }
    // The hand-off waits per token of the timed decode runs (a depth's fill and the prompt
    // tests, whose host-routed layers the GPU also waits for, are left out).
    for (const Result& r : results) {
      if (r.n_gen == 0 || r.samples_ts.empty() || a.spec.type != "none" || !a.parallel.empty()) {
        continue;
      }
      const double tokens =
          static_cast<double>(r.n_gen * static_cast<int64_t>(r.samples_ts.size()));
      std::fprintf(stderr,
                   "moe-bench: %s: per token the GPU waited %.0f us for host routing, the CPU "
                   "share %.0f us for the GPU's routing\n",
                   r.test.c_str(), r.gpu_route_wait_ms * 1e3 / tokens,
                   r.cpu_route_wait_ms * 1e3 / tokens);
    }
  }
  const std::string name = std::filesystem::path(a.model).filename().string();
  const double gib = static_cast<double>(bytes) / static_cast<double>(1ull << 30);
  if (a.output == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Result& r : results) {
      out.push_back({{"model_filename", a.model},
                     {"model_type", std::string(model->name())},
                     {"model_size", bytes},
                     {"model_n_params", params},
                     {"backend", backend},
                     {"n_gpu_layers", a.gpu.n_gpu_layers},
                     {"n_threads", threads},
                     {"type_k", a.kv.ctk},
                     {"type_v", a.kv.ctv},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"n_depth", r.depth},
                     {"test", r.test},
                     {"avg_ts", r.mean},
                     {"median_ts", r.median},
                     {"stddev_ts", r.stddev},
                     {"samples_ts", r.samples_ts}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("| model | size | params | backend | threads | test | t/s |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  for (const Result& r : results) {
    std::printf("| %s | %.2f %s | %s | %s | %d | %s | %.2f ± %.2f |\n", name.c_str(),
                gib >= 1.0 ? gib : gib * 1024.0, gib >= 1.0 ? "GiB" : "MiB",
                format_params(params).c_str(), backend.c_str(), threads, r.test.c_str(), r.median,
                r.stddev);
  }
  for (const Result& r : results) {
    if (!r.ops.empty())
      std::printf("\nops of %s, %d threads:\n%s", r.test.c_str(), threads, r.ops.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> argv_s;
  std::vector<char*> argv_p = moe::tools::llama_style_argv(argc, argv, argv_s);

  CLI::App app{"Measure prompt processing and generation speed of a MoE GGUF model"};
  Args a;
  app.add_option("-m,--model", a.model, "GGUF model file")->required();
  app.add_option("-p,--n-prompt", a.n_prompt, "prompt tokens (pp test; 0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("-n,--n-gen", a.n_gen, "generated tokens (tg test; 0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("-d,--n-depth", a.depths,
                 "tokens already in the cache before each test, as llama-bench (e.g. -d 0,8192)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("-c,--ctx-size", a.n_ctx,
                 "the KV cache's length (default: what the deepest test needs), so the start-up "
                 "line shows the VRAM a long context takes")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--n-parallel-list", a.parallel,
                 "-npl 1,2,4,8: sequences decoded together, as llama-batched-bench (each "
                 "evaluates -p tokens, then decodes -n)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("-t,--threads", a.threads, "threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-r,--repetitions", a.reps, "repetitions of each test (after one warm-up)")
      ->check(CLI::Range(1, 1000));
  app.add_option("-o,--output", a.output, "output format: md|json")
      ->check(CLI::IsMember({"md", "json"}));
  moe::tools::add_kv_options(app, a.kv);
  app.add_option("--experts", a.experts, "where routed experts run: inproc|process")
      ->check(CLI::IsMember({"inproc", "process"}));
  app.add_option("--mmap", a.gpu.mmap,
                 "-mmp 1: map the model file; -mmp 0: read it into memory (transparent huge "
                 "pages), as llama-bench (default: read in with CPU-homed experts on a GPU when "
                 "it fits in 80% of the available memory, else mapped)")
      ->check(CLI::Range(0, 1));
  app.add_option("--pool-spin", a.pool_spin,
                 "pause iterations an idle thread-pool thread spins before sleeping (both "
                 "processes with --experts process)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--worker-threads", a.worker_threads,
                 "expert worker threads with --experts process (default: --threads)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--op-profile", a.op_profile,
               "time each op of the CPU forward during the timed runs and print a table per test "
               "(-ngl 0; -npl is not profiled)");
  app.add_option("--worker-bin", a.worker_bin,
                 "moe-cpu-worker binary (default: the one next to moe-bench)");
  moe::tools::add_spec_options(
      app, a.spec,
      "greedy decode of -n tokens after -p random ids, without and then with drafts (-d, -npl "
      "and --op-profile do not apply)");
  app.add_flag("--spec-drafts-fail", a.spec_drafts_fail,
               "--spec-type: draft --draft-max random ids at every step instead of looking up "
               "(drafts that fail: the cost model's worst case)");
  app.add_option("--spec-drafts-accept", a.spec_drafts_accept,
                 "--spec-type: draft the greedy run's next --draft-max tokens, each kept with "
                 "this probability (else a wrong id): the gain at a chosen acceptance")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--expert-prediction", a.expert_prediction,
               "instead of timing: how often layer l+1's router applied to layer l's hidden state "
               "names the experts layer l+1 picks, per layer, over -p random ids (issue 29)");
  moe::gpu::add_gpu_options(app, a.gpu, /*mmap_flag=*/false);
  try {
    app.parse(static_cast<int>(argv_p.size()), argv_p.data());
    if (a.n_prompt == 0 && a.n_gen == 0) throw CLI::ValidationError("-p and -n are both 0");
    if (a.expert_prediction && a.n_prompt < 1) {
      throw CLI::ValidationError("--expert-prediction needs -p 1 or more");
    }
    moe::tools::check_spec_args(a.spec);
    if (a.spec_drafts_fail && a.spec.type == "none") {
      throw CLI::ValidationError("--spec-drafts-fail needs --spec-type");
    }
    if (a.spec_drafts_accept >= 0 && (a.spec.type == "none" || a.spec_drafts_fail)) {
      throw CLI::ValidationError(
          "--spec-drafts-accept needs --spec-type and does not combine with --spec-drafts-fail");
    }
    if (a.spec.type != "none") {
      if (a.n_gen < 2) throw CLI::ValidationError("--spec-type needs -n 2 or more");
      if (!a.parallel.empty() || a.depths != std::vector<int64_t>{0} || a.op_profile) {
        throw CLI::ValidationError("--spec-type does not combine with -d, -npl or --op-profile");
      }
    }
    if (a.gpu.n_gpu_layers > 0 && app.count("--pool-spin") == 0) {
      a.pool_spin = moe::gpu::kGpuPoolSpin;
    }
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench: error: %s\n", e.what());
    return 1;
  }
}
