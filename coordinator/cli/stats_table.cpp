#include "coordinator/cli/stats_table.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "coordinator/cli/output.h"
#include "coordinator/residency/expert_policy.h"

namespace moe::cli {

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(s.data(), s.size(), fmt, ap2);
  va_end(ap2);
  s.resize(static_cast<size_t>(std::max(n, 0)));
  return s;
}

std::string u64(uint64_t v) { return std::to_string(v); }

// Tokens per second of `tokens` done in `ms`; 0 when no time was spent.
double per_second(uint64_t tokens, double ms) {
  return ms > 0 ? 1e3 * static_cast<double>(tokens) / ms : 0.0;
}

std::string kind_name(moe::v1::WorkerKind k) {
  switch (k) {
    case moe::v1::WORKER_KIND_CPU:
      return "cpu";
    case moe::v1::WORKER_KIND_GPU:
      return "gpu";
    default:
      return "?";
  }
}

std::string state_name(moe::v1::WorkerState s) {
  switch (s) {
    case moe::v1::WORKER_STATE_STARTING:
      return "starting";
    case moe::v1::WORKER_STATE_READY:
      return "ready";
    case moe::v1::WORKER_STATE_DEAD:
      return "dead";
    default:
      return "?";
  }
}

std::string age(double ms) {
  if (ms < 0) return "-";
  if (ms < 1000) return format("%.0f ms", ms);
  return format("%.1f s", ms / 1e3);
}

// "0-3,8,10-11".
std::string cpu_list(const google::protobuf::RepeatedField<int32_t>& cpus) {
  std::vector<int32_t> v(cpus.begin(), cpus.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(v[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(v[j]);
    }
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

// Columns separated by two spaces; numeric columns right-aligned.
struct Table {
  std::vector<std::string> header;
  std::vector<bool> right;
  std::vector<std::vector<std::string>> rows;

  std::string render() const {
    std::vector<size_t> width(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
      width[c] = header[c].size();
      for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
    }
    std::string out;
    const auto line = [&](const std::vector<std::string>& cells) {
      std::string l;
      for (size_t c = 0; c < cells.size(); ++c) {
        if (c > 0) l += "  ";
        const std::string pad(width[c] - cells[c].size(), ' ');
        l += right[c] ? pad + cells[c] : cells[c] + pad;
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      out += l + "\n";
    };
    line(header);
    for (const auto& r : rows) line(r);
    return out;
  }
};

}  // namespace

std::string format_stats_table(const moe::v1::GetStatsResponse& s,
                               const moe::v1::GetPlacementResponse& p) {
  using ull = unsigned long long;
  std::string out;
  out += cat("model:      ", escape_bytes(s.model()), '\n');
  out += format("uptime:     %.1f s%s\n", s.uptime_s(), s.draining() ? " (draining)" : "");
  out += format(
      "requests:   accepted %llu, completed %llu, failed %llu, cancelled %llu, "
      "rejected %llu; running %u\n",
      ull{s.requests_accepted()}, ull{s.requests_completed()}, ull{s.requests_failed()},
      ull{s.requests_cancelled()}, ull{s.requests_rejected()}, s.running());
  out += format("queue:      %u / %u\n", s.queue_depth(), s.queue_capacity());
  out += format(
      "tokens:     prompt %llu in %.2f s (%.2f tok/s); generated %llu in %.2f s "
      "(%.2f tok/s); last request %.2f tok/s\n",
      ull{s.prompt_tokens()}, s.prompt_ms() / 1e3, per_second(s.prompt_tokens(), s.prompt_ms()),
      ull{s.generated_tokens()}, s.generation_ms() / 1e3,
      per_second(s.generated_tokens(), s.generation_ms()), s.last_tokens_per_second());
  out += cat("placement:  ", escape_bytes(p.source().empty() ? "?" : p.source()),
             format("; coordinator threads %d; ", p.coordinator_threads()),
             p.in_process() ? "experts in-process" : "experts in worker processes", '\n');

  std::map<std::string, const moe::v1::WorkerPlacement*> placed;
  for (const auto& w : p.workers()) placed[w.worker_id()] = &w;
  if (s.workers_size() == 0 && p.workers_size() == 0) return out + "workers:    none\n";

  Table t;
  t.header = {"WORKER", "KIND", "STATE", "PID",     "RESTARTS", "HEARTBEAT",
              "SERVED", "BUSY", "NUMA",  "THREADS", "CPUS"};
  t.right = {false, false, false, true, true, true, true, true, true, true, false};
  std::map<std::string, bool> listed;
  for (const auto& w : s.workers()) {
    listed[w.worker_id()] = true;
    const auto it = placed.find(w.worker_id());
    const moe::v1::WorkerPlacement* wp = it == placed.end() ? nullptr : it->second;
    t.rows.push_back({escape_bytes(w.worker_id()), kind_name(w.kind()), state_name(w.state()),
                      w.pid() > 0 ? std::to_string(w.pid()) : "-", std::to_string(w.restarts()),
                      age(w.last_heartbeat_age_ms()), u64(w.requests_served()),
                      format("%.2f s", w.busy_ms() / 1e3),
                      wp == nullptr || wp->numa_node() < 0 ? "-" : std::to_string(wp->numa_node()),
                      wp == nullptr ? "-" : std::to_string(wp->threads()),
                      wp == nullptr ? "-" : cpu_list(wp->cpus())});
  }
  for (const auto& wp : p.workers()) {  // placed but not (yet) in the stats
    if (listed.count(wp.worker_id()) != 0) continue;
    t.rows.push_back({escape_bytes(wp.worker_id()), kind_name(wp.kind()), "-",
                      wp.pid() > 0 ? std::to_string(wp.pid()) : "-", "-", "-", "-", "-",
                      wp.numa_node() < 0 ? "-" : std::to_string(wp.numa_node()),
                      std::to_string(wp.threads()), cpu_list(wp.cpus())});
  }
  out += '\n';
  out += t.render();
  return out + format_expert_runtime(s) + format_layer_table(s, p);
}

std::string format_expert_runtime(const moe::v1::GetStatsResponse& s) {
  if (!s.has_experts()) return "";
  const moe::v1::ExpertRuntime& x = s.experts();
  const uint64_t all = x.items_vram() + x.items_pcie() + x.items_cpu();
  const auto pct = [&](uint64_t v) {
    return all == 0 ? std::string("-")
                    : format("%.1f%%", 100.0 * static_cast<double>(v) / static_cast<double>(all));
  };
  const auto rate = [](double v, const char* fmt) { return v > 0 ? format(fmt, v) : "-"; };
  std::string out = "\nexpert items: " + pct(x.items_vram()) + " on VRAM copies, " +
                    pct(x.items_pcie()) + " copied over PCIe, " + pct(x.items_cpu()) +
                    " on the CPU (" + u64(all) + " in all)\n";
  out += format("PCIe: %.2f GiB copied, %s; %s misses admitted into the pool, %s evictions\n",
                static_cast<double>(x.pcie_bytes()) / (1u << 30),
                rate(x.pcie_gbps(), "%.1f GB/s").c_str(), u64(x.admitted()).c_str(),
                u64(x.evictions()).c_str());
  out += format(
      "busy: CPU share %.2f s, GPU experts (split layers) %.2f s; per expert: CPU %s, "
      "GPU %s\n",
      x.cpu_busy_ms() / 1e3, x.gpu_busy_ms() / 1e3, rate(x.cpu_us_per_expert(), "%.1f us").c_str(),
      rate(x.gpu_us_per_expert(), "%.1f us").c_str());
  out += format("waits: GPU for host routing %.2f s, CPU share for device routing %.2f s\n",
                x.gpu_route_wait_ms() / 1e3, x.cpu_route_wait_ms() / 1e3);
  out += format("VRAM: %.0f of %.0f MiB\n", static_cast<double>(x.vram_used_bytes()) / (1 << 20),
                static_cast<double>(x.vram_budget_bytes()) / (1 << 20));
  return out;
}

std::string format_layer_table(const moe::v1::GetStatsResponse& s,
                               const moe::v1::GetPlacementResponse& p) {
  if (s.layers_size() == 0) return "";
  std::map<int32_t, const moe::v1::LayerPlacement*> where;
  for (const auto& l : p.layers()) where[l.layer()] = &l;
  Table t;
  t.header = {"LAYER",  "CALLS",       "TOKENS",
              "ROUTED", "GPU HITS",    "CPU (MISSES)",
              "HIT %",  "EXPERT TIME", "EXPERTS VRAM/DIRECT/CPU"};
  t.right = {true, true, true, true, true, true, true, true, true};
  for (const auto& l : s.layers()) {
    const uint64_t seen = l.gpu_hits() + l.gpu_misses();
    const auto it = where.find(l.layer());
    t.rows.push_back({std::to_string(l.layer()), u64(l.calls()), u64(l.tokens()), u64(l.routed()),
                      u64(l.gpu_hits()), u64(l.gpu_misses()),
                      seen == 0 ? "-"
                                : format("%.1f", 100.0 * static_cast<double>(l.gpu_hits()) /
                                                     static_cast<double>(seen)),
                      format("%.2f s", l.expert_ms() / 1e3),
                      it == where.end() ? "-"
                                        : format("%d/%d/%d", it->second->vram(),
                                                 it->second->direct(), it->second->cpu())});
  }
  return cat('\n', t.render());
}

std::string format_policy(const moe::v1::ExpertPolicyResponse& r,
                          const moe::v1::GetPlacementResponse& placement) {
  const moe::v1::ExpertPolicy& p = r.policy();
  const auto mib = [](uint64_t b) {
    return format("%.0f MiB", static_cast<double>(b) / (1 << 20));
  };
  std::string out;
  if (p.pool_slots() == 0) {
    out += "pool:              none (up to " + mib(p.pool_max_bytes()) + ")\n";
  } else {
    out += format("pool:              %s, %lld of %lld slots filled (%.1f MiB each; up to %s)\n",
                  mib(p.pool_bytes()).c_str(), static_cast<long long>(p.pool_filled()),
                  static_cast<long long>(p.pool_slots()),
                  static_cast<double>(p.slot_bytes()) / (1 << 20), mib(p.pool_max_bytes()).c_str());
  }
  out += "stream share:      " + model::format_share(p.stream_share()) + "\n";
  out += "direct share:      " + model::format_share(p.direct_share()) +
         format(" (in effect %.2f)\n", p.direct_share_now());
  out += "prefill CPU share: " + model::format_share(p.prefill_cpu_share()) + "\n";
  out += cat("profiler:          ", p.profiler_new() ? "new" : "old", '\n');
  out += cat("grouping:          ", p.grouping() ? "layout" : "off", '\n');
  out +=
      format("changes:           %llu since start", static_cast<unsigned long long>(p.changes()));
  if (p.recalibrated_ms() > 0) out += format("; last recalibration %.0f ms", p.recalibrated_ms());
  out += format("; this call %.1f ms\n", r.apply_ms());
  if (placement.layers_size() == 0) return out;
  Table t;
  t.header = {"LAYER", "HOME", "VRAM", "DIRECT", "CPU"};
  t.right = {true, false, true, true, true};
  for (const auto& l : placement.layers()) {
    t.rows.push_back({std::to_string(l.layer()), l.gpu_home() ? "gpu" : "cpu",
                      std::to_string(l.vram()), std::to_string(l.direct()),
                      std::to_string(l.cpu())});
  }
  return out + '\n' + t.render();
}

std::string format_policy_json(const moe::v1::ExpertPolicyResponse& policy,
                               const moe::v1::GetPlacementResponse& placement) {
  nlohmann::ordered_json j;
  j["policy"] = nlohmann::ordered_json::parse(to_json(policy));
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : placement.layers())
    layers.push_back(nlohmann::ordered_json::parse(to_json(l)));
  j["layers"] = std::move(layers);
  return j.dump() + "\n";
}

std::string format_stats_json(const moe::v1::GetStatsResponse& stats,
                              const moe::v1::GetPlacementResponse& placement) {
  nlohmann::ordered_json j;
  j["stats"] = nlohmann::ordered_json::parse(to_json(stats));
  j["placement"] = nlohmann::ordered_json::parse(to_json(placement));
  return j.dump() + "\n";
}

}  // namespace moe::cli
