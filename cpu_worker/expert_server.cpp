#include "cpu_worker/expert_server.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <utility>

#include "common/error.h"
#include "common/shm/futex.h"

namespace moe::worker {
namespace {

std::string range(int64_t lo, int64_t hi) {
  std::string r(1, '[');  // appended, not "[" + ...: GCC 12 warns falsely (-Wrestrict) on that
  r += std::to_string(lo);
  r += ", ";
  r += std::to_string(hi);
  r += ')';
  return r;
}

shm::ExpertResponse answer(uint64_t seq, shm::ExpertStatus status, const std::string& message) {
  shm::ExpertResponse r{};
  r.seq = seq;
  r.status = static_cast<int32_t>(status);
  std::snprintf(r.message, sizeof r.message, "%s", message.c_str());
  return r;
}

}  // namespace

ExpertServer::ExpertServer(model::ExpertExecutor& experts, const ExpertModelShape& shape,
                           const shm::ExpertSegment& segment,
                           std::function<bool()> coordinator_alive, uint32_t spin)
    : experts_(experts),
      shape_(shape),
      seg_(segment),
      requests_(segment.requests),
      responses_(segment.responses) {
  if (seg_.dims.n_embd != shape.n_embd) {
    throw Error("expert segment: n_embd " + std::to_string(seg_.dims.n_embd) + ", the model has " +
                std::to_string(shape.n_embd));
  }
  if (seg_.header->worker_ready.load(std::memory_order_acquire) != 0) {
    throw Error("expert segment: another worker is already attached");
  }
  wait_.timeout = std::chrono::seconds(1);
  wait_.spin = spin;
  wait_.peer_alive = std::move(coordinator_alive);
}

std::string ExpertServer::validate(const shm::ExpertRequest& req) {
  if (req.kind != static_cast<uint32_t>(shm::ExpertRequestKind::Run)) {
    return "unknown request kind " + std::to_string(req.kind);
  }
  if (req.layer < 0 || req.layer >= shape_.n_layer) {
    return "layer " + std::to_string(req.layer) + " not in " + range(0, shape_.n_layer);
  }
  if (req.n_tokens < 0 || req.n_tokens > seg_.dims.max_tokens) {
    return "n_tokens " + std::to_string(req.n_tokens) + " not in " +
           range(0, seg_.dims.max_tokens + 1);
  }
  if (req.n_items < 0 || req.n_items > seg_.dims.max_items) {
    return "n_items " + std::to_string(req.n_items) + " not in " +
           range(0, seg_.dims.max_items + 1);
  }
  // A private copy: the coordinator could rewrite the shared items while we compute.
  items_.resize(static_cast<size_t>(req.n_items));
  for (int32_t i = 0; i < req.n_items; ++i) {
    const shm::ExpertWorkItem w = seg_.items[i];
    const std::string item = "item " + std::to_string(i) + ": ";
    if (w.token < 0 || w.token >= req.n_tokens) {
      return item + "token " + std::to_string(w.token) + " not in " + range(0, req.n_tokens);
    }
    if (w.expert < 0 || w.expert >= shape_.n_expert) {
      return item + "expert " + std::to_string(w.expert) + " not in " + range(0, shape_.n_expert);
    }
    if (!std::isfinite(w.weight)) return item + "weight is not finite";
    items_[static_cast<size_t>(i)] = {w.token, w.expert, w.weight};
  }
  return "";
}

shm::ExpertResponse ExpertServer::handle(const shm::ExpertRequest& req) {
  const std::string bad = validate(req);
  if (!bad.empty()) return answer(req.seq, shm::ExpertStatus::BadRequest, "bad request: " + bad);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    experts_.run(req.layer, seg_.x, req.n_tokens, items_, seg_.out);
  } catch (const std::exception& e) {
    return answer(req.seq, shm::ExpertStatus::Failed, e.what());
  }
  busy_ns_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - t0)
                                               .count()),
                     std::memory_order_relaxed);
  served_.fetch_add(1, std::memory_order_relaxed);
  return answer(req.seq, shm::ExpertStatus::Ok, "");
}

ServeEnd ExpertServer::serve() {
  seg_.header->worker_pid = static_cast<int32_t>(::getpid());
  seg_.header->worker_ready.store(1, std::memory_order_release);
  shm::futex_wake(seg_.header->worker_ready, 1);
  shm::ExpertRequest req;
  for (;;) {
    shm::WaitStatus st;
    while ((st = requests_.pop(&req, sizeof req, wait_)) == shm::WaitStatus::Timeout) {
    }
    if (st != shm::WaitStatus::Ok) return ServeEnd::CoordinatorGone;
    if (req.kind == static_cast<uint32_t>(shm::ExpertRequestKind::Shutdown)) {
      return ServeEnd::Shutdown;
    }
    const shm::ExpertResponse resp = handle(req);
    while ((st = responses_.push(&resp, sizeof resp, wait_)) == shm::WaitStatus::Timeout) {
    }
    if (st != shm::WaitStatus::Ok) return ServeEnd::CoordinatorGone;
  }
}

}  // namespace moe::worker
