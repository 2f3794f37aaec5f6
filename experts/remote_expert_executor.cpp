#include "experts/remote_expert_executor.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/shm/futex.h"

namespace moe::model {
namespace {

// Items are copied into the segment as they are.
static_assert(sizeof(ExpertItem) == sizeof(shm::ExpertWorkItem) &&
              offsetof(ExpertItem, token) == offsetof(shm::ExpertWorkItem, token) &&
              offsetof(ExpertItem, expert) == offsetof(shm::ExpertWorkItem, expert) &&
              offsetof(ExpertItem, weight) == offsetof(shm::ExpertWorkItem, weight));

shm::ExpertDims dims_of(const RemoteExpertOptions& opt) {
  return {opt.n_embd, opt.max_tokens, opt.max_items};
}

shm::ShmSegment create_segment(const RemoteExpertOptions& opt) {
  // Leftovers of crashed runs are not ours to keep; failing to remove one must not stop us.
  try {
    shm::remove_stale_segments();
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
  const size_t bytes = shm::expert_segment_layout(dims_of(opt)).total;
  return shm::ShmSegment::create(shm::run_segment_name(opt.role), bytes);
}

ChildProcess spawn_worker(const RemoteExpertOptions& opt, const std::string& segment) {
  if (opt.threads < 1) throw Error("CPU worker: thread count must be at least 1");
  std::vector<std::string> argv = {opt.worker_bin,
                                   "--model",
                                   opt.model_path,
                                   "--segment",
                                   segment,
                                   "--coordinator-pid",
                                   std::to_string(::getpid()),
                                   "--threads",
                                   std::to_string(opt.threads),
                                   "--spin",
                                   std::to_string(opt.spin),
                                   "--pool-spin",
                                   std::to_string(opt.pool_spin)};
  argv.insert(argv.end(), opt.extra_args.begin(), opt.extra_args.end());
  if (!opt.cpus.empty()) {
    std::string list;
    for (int c : opt.cpus) {
      if (!list.empty()) list += ',';
      list += std::to_string(c);
    }
    argv.insert(argv.end(), {"--cpus", list});
  }
  try {
    return ChildProcess::spawn(argv);
  } catch (const Error& e) {
    throw Error(std::string("CPU worker: ") + e.what());
  }
}

}  // namespace

RemoteExpertExecutor::RemoteExpertExecutor(const RemoteExpertOptions& opt)
    : seg_(create_segment(opt)),
      view_(shm::format_expert_segment(seg_.data(), seg_.size(), dims_of(opt))),
      requests_(view_.requests),
      responses_(view_.responses),
      worker_(spawn_worker(opt, seg_.name())) {
  // The worker is our child, so waitpid tells its death at once (a dead peer never wakes us).
  wait_.peer_alive = [this, hung = opt.hung] {
    if (!worker_.running()) return false;
    if (!hung) return true;
    std::string why = hung();
    if (why.empty()) return true;
    hung_ = std::move(why);
    worker_.kill();
    return false;
  };
  wait_.spin = opt.spin;
  wait_ready(opt);
}

void RemoteExpertExecutor::wait_ready(const RemoteExpertOptions& opt) {
  const auto deadline = std::chrono::steady_clock::now() + opt.start_timeout;
  std::atomic<uint32_t>& ready = view_.header->worker_ready;
  while (ready.load(std::memory_order_acquire) == 0) {
    if (!worker_.running()) {
      throw Error("CPU worker '" + opt.worker_bin + "' (pid " + std::to_string(worker_.pid()) +
                  ") " + worker_.describe() + " before it was ready (its message is on stderr)");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      worker_.kill();
      throw Error("CPU worker '" + opt.worker_bin + "' (pid " + std::to_string(worker_.pid()) +
                  ") was not ready after " + std::to_string(opt.start_timeout.count()) + " ms");
    }
    shm::futex_wait(ready, 0, std::chrono::milliseconds(20));
  }
  if (view_.header->worker_pid != worker_.pid()) {
    throw Error("expert segment " + seg_.name() + ": attached by pid " +
                std::to_string(view_.header->worker_pid) + ", not our worker (pid " +
                std::to_string(worker_.pid()) + ")");
  }
}

RemoteExpertExecutor::~RemoteExpertExecutor() {
  try {
    if (!dead_ && worker_.running()) {
      const shm::ExpertRequest req{++seq_, 0, 0, 0,
                                   static_cast<uint32_t>(shm::ExpertRequestKind::Shutdown)};
      shm::WaitOptions opt = wait_;
      opt.timeout = std::chrono::milliseconds(500);
      requests_.push(&req, sizeof req, opt);
      if (!worker_.wait_for(std::chrono::seconds(2))) {
        std::fprintf(stderr, "warning: CPU worker (pid %d) ignored SHUTDOWN; killing it\n",
                     static_cast<int>(worker_.pid()));
      }
    }
  } catch (const std::exception& e) {  // a corrupt ring; the kill below still happens
    std::fprintf(stderr, "warning: CPU worker shutdown: %s\n", e.what());
  }
  worker_.kill();  // no-op when it exited; the segment goes with seg_
}

void RemoteExpertExecutor::throw_dead() {
  dead_ = true;
  worker_.running();  // reaps it if it has just exited, so describe() says how
  if (!hung_.empty()) {
    throw Error("CPU worker (pid " + std::to_string(worker_.pid()) + ") " + hung_ +
                "; it was killed");
  }
  throw Error("CPU worker (pid " + std::to_string(worker_.pid()) + ") died (" + worker_.describe() +
              ")");
}

void RemoteExpertExecutor::push_request(int64_t layer, int64_t n_tokens, int64_t n_items) {
  const shm::ExpertRequest req{++seq_, static_cast<int32_t>(layer), static_cast<int32_t>(n_tokens),
                               static_cast<int32_t>(n_items),
                               static_cast<uint32_t>(shm::ExpertRequestKind::Run)};
  shm::WaitStatus st;
  while ((st = requests_.push(&req, sizeof req, wait_)) == shm::WaitStatus::Timeout) {
  }
  if (st != shm::WaitStatus::Ok) throw_dead();
}

void RemoteExpertExecutor::await_response() {
  // No overall deadline: a large prefill request may take long. Liveness is what we check: the
  // process runs, and (opt.hung) it still sends heartbeats.
  shm::WaitStatus st;
  shm::ExpertResponse resp;
  while ((st = responses_.pop(&resp, sizeof resp, wait_)) == shm::WaitStatus::Timeout) {
  }
  if (st != shm::WaitStatus::Ok) throw_dead();
  const std::string who = "CPU worker (pid " + std::to_string(worker_.pid()) + ")";
  if (resp.seq != seq_) {
    throw Error(who + ": protocol error: answer " + std::to_string(resp.seq) + " to request " +
                std::to_string(seq_));
  }
  if (resp.status != static_cast<int32_t>(shm::ExpertStatus::Ok)) {
    throw Error(who + ": " + std::string(resp.message, strnlen(resp.message, sizeof resp.message)));
  }
}

void RemoteExpertExecutor::check_layer(int64_t layer) const {
  if (layer < 0 || layer > INT32_MAX) {
    throw Error("expert executor: layer " + std::to_string(layer) + " out of range");
  }
}

void RemoteExpertExecutor::submit(int64_t layer, const float* x, int64_t n_tokens,
                                  std::span<const ExpertItem> items) {
  if (dead_) throw_dead();
  check_layer(layer);
  const auto n_items = static_cast<int64_t>(items.size());
  if (pending_tokens_ >= 0) throw Error("expert executor: submit() before collect()");
  if (n_tokens < 0 || !fits(n_tokens, n_items)) {
    throw Error("expert executor: a batch of " + std::to_string(n_tokens) + " tokens and " +
                std::to_string(n_items) + " items does not fit one request");
  }
  const auto row_bytes = static_cast<size_t>(view_.dims.n_embd) * sizeof(float);
  std::memcpy(view_.x, x, static_cast<size_t>(n_tokens) * row_bytes);
  if (n_items > 0) std::memcpy(view_.items, items.data(), items.size_bytes());
  pending_tokens_ = n_tokens;
  push_request(layer, n_tokens, n_items);
}

void RemoteExpertExecutor::collect(float* out) {
  if (pending_tokens_ < 0) throw Error("expert executor: collect() without submit()");
  const int64_t n_tokens = pending_tokens_;
  pending_tokens_ = -1;
  await_response();
  const auto row_bytes = static_cast<size_t>(view_.dims.n_embd) * sizeof(float);
  std::memcpy(out, view_.out, static_cast<size_t>(n_tokens) * row_bytes);
}

void RemoteExpertExecutor::run(int64_t layer, const float* x, int64_t n_tokens,
                               std::span<const ExpertItem> items, float* out) {
  if (dead_) throw_dead();
  if (n_tokens <= 0) return;
  check_layer(layer);
  const int64_t n_items = static_cast<int64_t>(items.size());
  const auto row_bytes = static_cast<size_t>(view_.dims.n_embd) * sizeof(float);
  if (n_tokens > view_.dims.max_tokens || n_items > view_.dims.max_items) {
    run_chunked(layer, x, n_tokens, items, out);
    return;
  }
  // The common case, verbatim: the worker sees exactly what an in-process call would.
  std::memcpy(view_.x, x, static_cast<size_t>(n_tokens) * row_bytes);
  if (n_items > 0) std::memcpy(view_.items, items.data(), items.size_bytes());
  send(layer, n_tokens, n_items);
  std::memcpy(out, view_.out, static_cast<size_t>(n_tokens) * row_bytes);
}

// Requests of whole tokens: each token's items, in their order, go into one request whenever they
// fit in one, so each token's sum keeps the contract's order; only the rows an expert shares a
// call with differ from one big call (rounding, see the header).
void RemoteExpertExecutor::run_chunked(int64_t layer, const float* x, int64_t n_tokens,
                                       std::span<const ExpertItem> items, float* out) {
  const int64_t E = view_.dims.n_embd, max_t = view_.dims.max_tokens;
  const int64_t max_i = view_.dims.max_items, n_items = static_cast<int64_t>(items.size());
  for (const ExpertItem& it : items) {
    if (it.token < 0 || it.token >= n_tokens) {
      throw Error("expert executor: item (token " + std::to_string(it.token) + ", expert " +
                  std::to_string(it.expert) + ") out of range");
    }
  }
  // Stable counting sort of the items by token.
  offset_.assign(static_cast<size_t>(n_tokens) + 1, 0);
  for (const ExpertItem& it : items) ++offset_[static_cast<size_t>(it.token) + 1];
  for (int64_t t = 0; t < n_tokens; ++t) {
    offset_[static_cast<size_t>(t) + 1] += offset_[static_cast<size_t>(t)];
  }
  cursor_.assign(offset_.begin(), offset_.end() - 1);
  order_.resize(static_cast<size_t>(n_items));
  for (int64_t i = 0; i < n_items; ++i) {
    const auto t = static_cast<size_t>(items[static_cast<size_t>(i)].token);
    order_[static_cast<size_t>(cursor_[t]++)] = static_cast<int32_t>(i);
  }
  chunk_tokens_.resize(static_cast<size_t>(max_t));

  // Rows without items stay zero; partial sums of a split token add up (0 + v == v exactly).
  std::fill(out, out + n_tokens * E, 0.0f);
  int64_t lt = 0, li = 0;  // tokens and items in the request being filled
  auto flush = [&] {
    if (lt == 0) return;
    send(layer, lt, li);
    for (int64_t r = 0; r < lt; ++r) {
      float* o = out + chunk_tokens_[static_cast<size_t>(r)] * E;
      const float* y = view_.out + r * E;
      for (int64_t d = 0; d < E; ++d) o[d] += y[d];
    }
    lt = li = 0;
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    int64_t i = offset_[static_cast<size_t>(t)];
    const int64_t end = offset_[static_cast<size_t>(t) + 1];
    while (i < end) {
      const int64_t left = end - i;
      if (lt == max_t || li == max_i || (left <= max_i && left > max_i - li)) flush();
      const int64_t take = std::min(left, max_i - li);
      chunk_tokens_[static_cast<size_t>(lt)] = t;
      std::memcpy(view_.x + lt * E, x + t * E, static_cast<size_t>(E) * sizeof(float));
      for (int64_t k = 0; k < take; ++k) {
        const ExpertItem& it = items[static_cast<size_t>(order_[static_cast<size_t>(i + k)])];
        view_.items[li + k] = {static_cast<int32_t>(lt), it.expert, it.weight};
      }
      ++lt;
      li += take;
      i += take;
    }
  }
  flush();
}

}  // namespace moe::model
