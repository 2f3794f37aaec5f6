// moe-coordinator: loads the model, starts the CPU workers of the placement, and serves the gRPC
// Generation, Control, health and reflection services until SIGINT/SIGTERM or a Shutdown call.
//
// Order matters (DESIGN.md §2): the worker processes are spawned before anything heavy happens in
// this process (and, once there is a GPU path, before CUDA is initialised). The gRPC server starts
// first only because the workers register with it; it answers UNAVAILABLE until the engine runs.
// Every exit path stops the workers and removes their segments (RAII), so nothing is orphaned.
#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/gguf.h"
#include "common/model_prefetch.h"
#include "common/placement/placement.h"
#include "common/progress.h"
#include "coordinator/chat_template/chat_template.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/layer_stats.h"
#include "coordinator/engine/worker_pool_experts.h"
#include "coordinator/engine/worker_registry.h"
#include "coordinator/gpu/gpu_cli.h"
#include "coordinator/gpu/model_factory.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/metrics.h"
#include "coordinator/main/llama_server_flags.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/server/control_service.h"
#include "coordinator/server/generation_service.h"
#include "coordinator/server/grpc_auth.h"
#include "coordinator/server/health_service.h"
#include "coordinator/server/serving_state.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tools/kv_cli.h"
#include "coordinator/tools/llama_cli_args.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using namespace moe;

struct Args {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 50051;
  std::string placement = "auto";
  int threads = 0;  // coordinator threads; 0: the placement's
  int64_t n_ctx = 0;
  tools::KvArgs kv;
  int64_t n_batch = 512;
  size_t queue_size = 16;
  std::string worker_bin;
  int worker_timeout_s = 120;
  double worker_silence_s = 10;
  std::string ready_file;
  int max_rpc_threads = 64;
  int pool_spin = cpu::ThreadPool::kDefaultSpin;
  int http_port = -1;  // off
  std::string http_host, api_key, api_key_file;
  std::vector<std::string> cors_origins;
  std::string alias;                        // the model's id over HTTP; empty: the file name
  std::string ssl_key_file, ssl_cert_file;  // both or neither: TLS on gRPC and HTTP
  size_t http_max_body = 8u << 20;
  int http_threads = 256;
  bool webui = true;  // the chat page at GET /
  bool prefetch = true;
  gpu::GpuOptions gpu;
  server::LlamaServerFlags llama;
};

std::atomic<bool> g_shutdown{false};

void log(const std::string& s) {
  std::fprintf(stderr, "moe-coordinator: %s\n", s.c_str());
  std::fflush(stderr);
}

// --ready-file: the gRPC address, then the HTTP address when HTTP is on, written once the servers
// answer. The file is ours alone. One already there is refused at start: it may be another
// program's, or left by a run killed with SIGKILL, and a watcher would take its address for ours.
// Ours is written aside and linked into place, so a watcher never reads half of it and nothing
// that appeared meanwhile is replaced; at exit it is removed only while it is still the one we
// wrote.
class ReadyFile {
 public:
  explicit ReadyFile(std::string path) : path_(std::move(path)) {
    struct stat st;
    if (!path_.empty() && ::lstat(path_.c_str(), &st) == 0) {
      throw Error("--ready-file " + path_ +
                  " already exists (another program's, or left by a run that was killed?); "
                  "remove it or name another file");
    }
  }
  ReadyFile(const ReadyFile&) = delete;
  ReadyFile& operator=(const ReadyFile&) = delete;
  ~ReadyFile() { remove(); }

  void write(const std::string& grpc_addr, const std::string& http_addr) {
    if (path_.empty()) return;
    std::string text = grpc_addr + "\n";
    if (!http_addr.empty()) text += "http " + http_addr + "\n";
    const std::string tmp = path_ + "." + std::to_string(::getpid()) + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
    struct stat st;
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
              ::fstat(fd, &st) == 0;
    ok = ::close(fd) == 0 && ok;
    if (ok && ::link(tmp.c_str(), path_.c_str()) != 0) {
      // EEXIST: created since the check at start. Other errors: a file system without hard
      // links, where rename is the next best (it would replace such a file).
      ok = errno != EEXIST && ::rename(tmp.c_str(), path_.c_str()) == 0;
    }
    const int err = errno;
    ::unlink(tmp.c_str());  // after link: the name in place keeps the file
    if (!ok) throw Error("cannot write --ready-file " + path_ + ": " + std::strerror(err));
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    written_ = true;
  }

  void remove() {
    struct stat st;
    if (written_ && ::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      ::unlink(path_.c_str());
    }
    written_ = false;
  }

 private:
  std::string path_;
  bool written_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// scripts/moe-coordinator sets MOE_EXIT_WITH_PARENT to its pid (scripts/with-mps, when it runs
// between, to its own): when that parent dies, even by SIGKILL, which runs none of its traps, the
// kernel sends us SIGTERM and we stop as on any SIGTERM (the workers follow us). False when the
// parent is gone already: the signal is armed only now, so an earlier death shows as another ppid.
bool exit_with_parent() {
  const char* v = std::getenv("MOE_EXIT_WITH_PARENT");
  if (v == nullptr || *v == '\0') return true;
  const auto parent = static_cast<pid_t>(std::atol(v));
  ::unsetenv("MOE_EXIT_WITH_PARENT");  // ours, not the workers'
  return ::prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 && ::getppid() == parent;
}

// Whether the coordinator's threads may run on a worker's cores (unpinned counts as shared).
bool shares_cores(const placement::Placement& p) {
  for (const placement::CpuWorkerSpec& w : p.cpu_workers) {
    if (p.coordinator_cpus.empty() || w.cpus.empty()) return true;
    for (int c : w.cpus) {
      if (std::find(p.coordinator_cpus.begin(), p.coordinator_cpus.end(), c) !=
          p.coordinator_cpus.end()) {
        return true;
      }
    }
  }
  return false;
}

// Blocks until SIGINT/SIGTERM (blocked in every thread, see main) or a Shutdown call.
void wait_for_shutdown() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec slice{0, 100 * 1000 * 1000};
  while (!g_shutdown.load()) {
    const int sig = sigtimedwait(&set, nullptr, &slice);
    if (sig > 0) {
      log(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + "; stopping");
      return;
    }
  }
  log("shutdown requested over gRPC; stopping");
}

// The API key (from --api-key or the first line of --api-key-file), and what must hold before any
// port is opened: no key off loopback is refused for gRPC as for HTTP, and two APIs on one port
// cannot both listen.
void check_listening(Args& a) {
  if (!a.api_key_file.empty()) {
    std::ifstream f(a.api_key_file);
    if (!f || !std::getline(f, a.api_key))
      throw Error("cannot read --api-key-file " + a.api_key_file);
    while (!a.api_key.empty() && (a.api_key.back() == '\r' || a.api_key.back() == ' ')) {
      a.api_key.pop_back();
    }
    if (a.api_key.empty()) throw Error("--api-key-file " + a.api_key_file + " holds an empty key");
  }
  if (!http::is_loopback(a.host) && a.api_key.empty()) {
    throw Error("gRPC on " + a.host + " (not a loopback address) needs --api-key");
  }
  if (a.ssl_key_file.empty() != a.ssl_cert_file.empty()) {
    throw Error("TLS needs both --ssl-key-file and --ssl-cert-file");
  }
  if (a.http_port > 0 && a.http_port == a.port) {
    throw Error("--port and --http-port are both " + std::to_string(a.port) +
                "; the gRPC and HTTP APIs need a port each");
  }
}

std::string read_pem(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream text;
  text << f.rdbuf();
  if (!f || text.str().empty()) throw Error(std::string("cannot read ") + flag + " " + path);
  return text.str();
}

std::shared_ptr<grpc::ServerCredentials> grpc_credentials(const Args& a) {
  if (a.ssl_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opt;
  opt.pem_key_cert_pairs.push_back(
      {read_pem(a.ssl_key_file, "--ssl-key-file"), read_pem(a.ssl_cert_file, "--ssl-cert-file")});
  return grpc::SslServerCredentials(opt);
}

// The gRPC server on --host:--port with `services`, answering UNAVAILABLE until the engine runs;
// `local` is set to the address it bound (the port chosen when --port is 0).
std::unique_ptr<grpc::Server> start_grpc(const Args& a,
                                         std::initializer_list<grpc::Service*> services,
                                         std::string& local) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string addr = a.host + ":" + std::to_string(a.port);
  builder.AddListeningPort(addr, grpc_credentials(a), &bound_port);
  // gRPC sets SO_REUSEPORT by default: a second coordinator would then bind the same port and
  // take half of its calls instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* s : services) builder.RegisterService(s);
  // Each streaming call holds a thread; beyond this the server answers RESOURCE_EXHAUSTED.
  grpc::ResourceQuota quota("moe-coordinator");
  quota.SetMaxThreads(a.max_rpc_threads);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    throw Error("gRPC: cannot listen on " + addr + " (in use by another process?)");
  }
  local = a.host + ":" + std::to_string(bound_port);
  return server;
}

// The placement's CPU worker processes, started and registered with the gRPC server at `local`.
std::unique_ptr<engine::WorkerPoolExperts> start_workers(const Args& a,
                                                         const model::ModelConfig& cfg,
                                                         const placement::Placement& place,
                                                         const std::string& local,
                                                         engine::WorkerRegistry& registry) {
  engine::WorkerPoolOptions wo;
  wo.base.worker_bin =
      a.worker_bin.empty()
          ? (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "moe-cpu-worker")
                .string()
          : a.worker_bin;
  wo.base.model_path = a.model;
  wo.base.n_embd = cfg.n_embd;
  wo.base.max_tokens = a.n_batch;
  wo.base.max_items = a.n_batch * cfg.n_expert_used;
  wo.base.start_timeout = std::chrono::seconds(a.worker_timeout_s);
  wo.workers = place.cpu_workers;
  // Spinning for the other side pays only when both have cores of their own; on shared cores
  // it steals the cycles the other side computes with (measured in docs/performance-log.md).
  wo.base.pool_spin = a.pool_spin;
  wo.base.spin = shares_cores(place) ? 0 : static_cast<uint32_t>(std::max(a.pool_spin, 2000));
  wo.coordinator_addr = local;
  wo.register_timeout = std::chrono::seconds(a.worker_timeout_s);
  wo.silence_limit = std::chrono::milliseconds(static_cast<int64_t>(a.worker_silence_s * 1000));
  auto workers = std::make_unique<engine::WorkerPoolExperts>(std::move(wo), registry);
  log("CPU workers ready: " + std::to_string(workers->size()));
  return workers;
}

// Reads the weights into the page cache now, with progress, rather than page-faulting them in
// during the first requests.
void prefetch_weights(const gguf::GgufFile& file) {
  Progress progress("loading model", gguf::tensor_data_bytes(file), Progress::Unit::Bytes);
  gguf::prefetch_tensor_data(file, &progress, 2);
  progress.finish();
}

// Tokens per forward of a prompt (-b, at most -ub).
int64_t forward_batch(const Args& a) {
  return a.llama.ubatch > 0 ? std::min(a.n_batch, a.llama.ubatch) : a.n_batch;
}

// The sequences' cache layout, alike for the GPU's VRAM sizing and the engine: a sliding-window
// ring holds the window and one forward's tokens, as llama.cpp's SWA cache holds the window and
// one ubatch; with --context-shift on the GPU every position, since the GPU shifts whole caches
// only.
model::KvConfig sequence_kv(const Args& a) {
  model::KvConfig kv = tools::kv_config(a.kv);
  kv.swa_slack = forward_batch(a);
  if (a.llama.context_shift && a.gpu.n_gpu_layers > 0) kv.swa_full = true;
  return kv;
}

// The forward (CPU or GPU per the flags) on the workers' experts, or in-process ones on `pool`
// when there are no workers; it owns the executor, so the workers stop when it goes.
std::unique_ptr<model::ModelArch> load_model(const Args& a, const gguf::GgufFile& file,
                                             cpu::ThreadPool& pool,
                                             std::unique_ptr<engine::WorkerPoolExperts> workers,
                                             engine::LayerStats& layer_stats, int64_t n_ctx) {
  // Every executor is wrapped so GetStats and /metrics can show per-layer expert work.
  std::unique_ptr<model::ExpertExecutor> experts;
  if (workers) {
    experts = std::move(workers);
  } else {
    experts = model::cpu_experts_for(file, pool);
  }
  gpu::GpuOptions gpu_opt = a.gpu;
  gpu_opt.n_ctx = n_ctx;
  gpu_opt.n_seq = a.llama.n_parallel;
  gpu_opt.kv = sequence_kv(a);
  std::string model_placement;
  auto model = gpu::create_model(
      file, pool, std::make_unique<engine::InstrumentedExperts>(std::move(experts), layer_stats),
      gpu_opt, &model_placement);
  log(model_placement);
  if (a.llama.mlock && ::mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
    // As llama.cpp: a warning, not an error (RLIMIT_MEMLOCK is often below a model's size).
    log(std::string("warning: --mlock: mlockall failed (") + std::strerror(errno) +
        "); raise the memlock limit (ulimit -l) to keep the model in RAM");
  }
  return model;
}

engine::EngineOptions engine_options(const Args& a, int64_t n_ctx,
                                     engine::WorkerPoolExperts* workers, http::Metrics* metrics) {
  engine::EngineOptions eo;
  eo.n_ctx = n_ctx;
  eo.n_parallel = a.llama.n_parallel;
  eo.kv = sequence_kv(a);
  eo.queue_capacity = a.queue_size;
  eo.n_batch = forward_batch(a);
  eo.context_shift = a.llama.context_shift;
  if (workers != nullptr) eo.prepare = [workers] { workers->ensure_ready(); };
  eo.metrics = metrics;
  return eo;
}

// --http-port: the OpenAI-compatible HTTP API; `http_addr` is set to the address it listens on.
std::unique_ptr<http::HttpServer> start_http(const Args& a, server::ServingState& state,
                                             engine::WorkerRegistry& registry,
                                             http::Metrics& metrics, std::string& http_addr) {
  http::HttpOptions ho;
  ho.host = a.http_host.empty() ? a.host : a.http_host;
  ho.port = a.http_port;
  ho.api_key = a.api_key;
  ho.max_body_bytes = a.http_max_body;
  ho.threads = a.http_threads;
  ho.cors_origins = a.cors_origins;
  ho.ssl_cert_file = a.ssl_cert_file;
  ho.ssl_key_file = a.ssl_key_file;
  ho.model_id = a.alias.empty() ? state.model_name : a.alias;
  ho.strict_model = !a.alias.empty();
  ho.model_path = a.model;
  ho.webui = a.webui;
  ho.slot_save_path = a.llama.slot_save_path;
  auto http_server = std::make_unique<http::HttpServer>(ho, state, registry, metrics);
  http_addr = ho.host + ":" + std::to_string(http_server->port());
  log("OpenAI-compatible HTTP API on " + std::string(a.ssl_cert_file.empty() ? "http" : "https") +
      "://" + http_addr + "/v1" + (a.api_key.empty() ? "" : " (API key required)") +
      (a.webui ? "; chat page at /" : ""));
  return http_server;
}

// Stops serving: new calls see UNAVAILABLE; running ones end at their next token; then the
// servers drain.
void drain(engine::WorkerRegistry& registry, server::ServingState& state, engine::Engine& eng,
           grpc::Server& server, http::HttpServer* http_server) {
  registry.begin_shutdown();
  state.engine.store(nullptr);
  eng.stop();
  // The stopped engine has failed every job; give their streams a moment to send that status.
  // Then close: the short deadline also ends idle client connections, which a sync server would
  // otherwise wait for until the deadline.
  for (int i = 0; i < 100 && state.active_streams.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  if (http_server) http_server->stop();
}

int run(const Args& a, const std::string& worker_secret) {
  ReadyFile ready(a.ready_file);  // before anything starts: refused when it exists
  const auto file = moe::gpu::open_model(a.gpu, a.model, "moe-coordinator");
  const placement::Topology topo = placement::detect_topology();
  placement::Placement place = placement::resolve_placement(a.placement, topo, a.threads);
  if (a.threads > 0) place.coordinator_threads = a.threads;
  std::fprintf(stderr, "%s", place.describe().c_str());

  // Control first: the workers register with it while they start.
  server::ServingState state;
  engine::WorkerRegistry registry;
  const server::GrpcAuth auth(a.api_key, worker_secret);
  server::GenerationService generation(state, auth);
  server::HealthService health(state);
  server::ControlService control(state, registry, place, auth, [] { g_shutdown.store(true); });
  std::string local;
  std::unique_ptr<grpc::Server> server = start_grpc(a, {&generation, &health, &control}, local);

  const model::ModelConfig cfg = model::ModelConfig::from_gguf(file);
  std::unique_ptr<engine::WorkerPoolExperts> pool_experts;
  if (!place.in_process) pool_experts = start_workers(a, cfg, place, local, registry);
  engine::WorkerPoolExperts* workers = pool_experts.get();

  if (a.prefetch) prefetch_weights(file);
  const auto tok = tokenizer::Tokenizer::from_gguf(file);
  std::optional<ChatTemplate> tmpl;
  if (file.find("tokenizer.chat_template") != nullptr) {
    tmpl.emplace(std::string(file.require_string("tokenizer.chat_template")));
  }
  cpu::ThreadPool pool(
      gpu::cpu_pool_threads(a.gpu, place.coordinator_threads > 0 ? place.coordinator_threads : 1),
      place.coordinator_cpus, a.pool_spin);
  engine::LayerStats layer_stats(cfg.n_layer);
  // -c is the whole context, shared out among the -np slots as llama-server does.
  const int64_t n_ctx_total = a.n_ctx > 0 ? a.n_ctx : std::min<int64_t>(4096, cfg.n_ctx_train);
  if (cfg.n_ctx_train > 0 && n_ctx_total > cfg.n_ctx_train) {
    // As llama.cpp: allowed, but positions past the trained context are not what the model saw.
    log("warning: -c " + std::to_string(n_ctx_total) + " exceeds the context the model was " +
        "trained for (" + std::to_string(cfg.n_ctx_train) + "): expect worse output past it");
  }
  const int n_parallel = a.llama.n_parallel;
  const int64_t n_ctx = n_ctx_total / n_parallel;
  if (n_ctx < 1) {
    throw Error("-c " + std::to_string(n_ctx_total) + " cannot give each of -np " +
                std::to_string(n_parallel) + " slots a position");
  }
  auto model = load_model(a, file, pool, std::move(pool_experts), layer_stats, n_ctx);

  http::Metrics metrics;
  engine::EngineOptions eo = engine_options(a, n_ctx, workers, &metrics);
  eo.weights = engine::weights_hash(file);  // slot files restore only into these weights
  if (eo.context_shift && cfg.has_recurrent()) {
    // As llama.cpp, which turns it off for recurrent memory.
    log("warning: --context-shift: " + cfg.arch + " keeps a recurrent state, which cannot drop " +
        "positions; a full context ends the generation (as --no-context-shift)");
    eo.context_shift = false;
  }
  if (eo.context_shift && a.gpu.n_gpu_layers > 0 && cfg.n_swa > 0 && !a.kv.swa_full) {
    log("--context-shift: the sliding-window layers keep every position in VRAM (as --swa-full), "
        "since the GPU shifts whole caches only");
  }
  // The cache's layout by layer, checked before anything is served (a type the head size cannot
  // hold fails here, not at the first request).
  state.kv_cache =
      model::KvCache(model->config(), eo.n_ctx, eo.kv, model::KvStorage::None).describe();
  log("KV cache: " + state.kv_cache);
  auto eng = std::make_unique<engine::Engine>(*model, tok, eo);

  state.limits = {&tok, tmpl ? &*tmpl : nullptr, eo.n_ctx};
  state.limits.default_sampling = &a.llama.sampling.params();
  state.limits.default_seed = a.llama.sampling.seed();
  state.limits.default_max_tokens = a.llama.n_predict > 0 ? a.llama.n_predict : 0;
  state.model_name = std::filesystem::path(a.model).filename().string();
  state.layers = &layer_stats;
  state.engine.store(eng.get());
  log("serving " + state.model_name + " on " + local + " (context " + std::to_string(eo.n_ctx) +
      (eo.n_parallel > 1 ? " in each of " + std::to_string(eo.n_parallel) + " slots" : "") +
      ", queue " + std::to_string(eo.queue_capacity) + ")");
  std::unique_ptr<http::HttpServer> http_server;
  std::string http_addr;
  if (a.http_port >= 0) http_server = start_http(a, state, registry, metrics, http_addr);
  ready.write(local, http_addr);

  wait_for_shutdown();
  drain(registry, state, *eng, *server, http_server.get());
  eng.reset();
  model.reset();  // stops the workers and removes their segments
  ready.remove();
  log("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and only sigtimedwait sees them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (!exit_with_parent()) {
    std::fprintf(stderr,
                 "moe-coordinator: error: the process that started us (MOE_EXIT_WITH_PARENT) is "
                 "gone\n");
    return 1;
  }

  CLI::App app{"moe-runtime coordinator: serves a GGUF MoE model over gRPC"};
  Args a;
  app.add_option("-m,--model", a.model, "GGUF model file")->required();
  app.add_option("--host", a.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", a.port, "port (default 50051; 0: any free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--placement", a.placement,
                 "auto (one CPU worker per NUMA node), in-process, or a placement.yaml");
  app.add_option("-t,--threads", a.threads, "coordinator threads (default: the placement's)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-c,--ctx-size", a.n_ctx,
                 "context size (default min(4096, trained)); -np N slots get 1/N of it each, as "
                 "llama-server's")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  tools::add_kv_options(app, a.kv);
  app.add_option("-b,--batch-size", a.n_batch, "prompt tokens per forward (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{8192}));
  app.add_option("--queue-size", a.queue_size,
                 "requests that may wait; more get RESOURCE_EXHAUSTED (default 16)")
      ->check(CLI::Range(size_t{1}, size_t{4096}));
  app.add_option("--worker-bin", a.worker_bin, "moe-cpu-worker (default: beside this binary)");
  app.add_option("--worker-timeout", a.worker_timeout_s,
                 "seconds a worker may take to load and register (default 120)")
      ->check(CLI::Range(1, 3600));
  app.add_option("--worker-silence-timeout", a.worker_silence_s,
                 "seconds a CPU worker may send no heartbeat while a request waits on it before "
                 "it is killed as hung and the request fails (default 10; 0: never)")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--ready-file", a.ready_file,
                 "once serving, create FILE with HOST:PORT (then 'http HOST:PORT' with "
                 "--http-port), whole at once; FILE must not exist (refused at start, so a stale "
                 "one is never read as ours); removed on exit unless replaced meanwhile");
  app.add_option("--pool-spin", a.pool_spin,
                 "pause iterations idle compute threads (ours and the workers') spin before "
                 "sleeping; with cores of their own, ~1000000 keeps them awake between layers")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--http-port", a.http_port,
                 "serve the OpenAI-compatible HTTP API on this port (default: off; 0: any)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--http-host", a.http_host, "HTTP address (default: --host)");
  app.add_flag("!--no-webui", a.webui,
               "do not serve the chat page at GET / (llama-server's spelling; it then answers "
               "404)");
  app.add_option("--api-key", a.api_key,
                 "clients must send 'Authorization: Bearer KEY' (HTTP header or gRPC metadata; "
                 "required off loopback); /health and gRPC health stay open");
  app.add_option("--api-key-file", a.api_key_file, "read the API key from the first line of FILE");
  app.add_option("--ssl-key-file", a.ssl_key_file,
                 "PEM private key: serve gRPC and HTTP over TLS (with --ssl-cert-file)");
  app.add_option("--ssl-cert-file", a.ssl_cert_file, "PEM certificate (chain) for TLS");
  app.add_option("-a,--alias", a.alias,
                 "the model's id in /v1/models and responses; requests naming another model "
                 "get 404 (default: the file name, and any name is accepted)");
  app.add_option("--cors-origin", a.cors_origins,
                 "origin (scheme://host[:port]) whose web pages may call the HTTP API, or '*'; "
                 "repeatable (default: none: requests with an Origin header are refused)");
  app.add_option("--http-max-body", a.http_max_body, "largest request body in bytes (8 MiB)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  app.add_option("--http-threads", a.http_threads, "HTTP connections served at once (256)")
      ->check(CLI::Range(2, 1024));
  app.add_flag("!--no-prefetch", a.prefetch,
               "do not read the weights into the page cache at start (they are then faulted in "
               "by the first requests)");
  gpu::add_gpu_options(app, a.gpu);
  server::add_llama_server_flags(app, a.llama);
  app.add_option("--max-rpc-threads", a.max_rpc_threads, "gRPC server threads (default 64)")
      ->check(CLI::Range(4, 4096));
  std::vector<std::string> storage;
  std::vector<char*> args = tools::llama_style_argv(argc, argv, storage);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
    if (a.gpu.n_gpu_layers > 0 && app.count("--pool-spin") == 0) a.pool_spin = gpu::kGpuPoolSpin;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    check_listening(a);
    server::check_llama_server_flags(a.llama);
    (void)tools::kv_config(a.kv);  // a bad -ctv-first TYPE,N fails before anything starts
    if (a.llama.moe_resident == "off") a.gpu.moe_resident_mib = 0;
    // Set before any thread exists (setenv is not thread-safe); the spawned workers inherit it.
    const std::string worker_secret = server::make_worker_secret();
    ::setenv(kWorkerSecretEnv, worker_secret.c_str(), 1);
    return run(a, worker_secret);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-coordinator: error: %s\n", e.what());
    return 1;
  }
}
