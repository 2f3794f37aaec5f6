// stats, policy, health and shutdown: the Control and grpc.health.v1 services.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "coordinator/cli/cli_commands.h"
#include "coordinator/cli/cli_error.h"
#include "coordinator/cli/output.h"
#include "coordinator/cli/stats_table.h"
#include "coordinator/residency/expert_policy.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "moe/v1/control.grpc.pb.h"

namespace moe::cli {

namespace {

using HealthStatus = grpc::health::v1::HealthCheckResponse;

constexpr auto kHealthRetry = std::chrono::milliseconds(200);

// One unary Control call with the --timeout deadline; a non-OK status throws RpcError.
template <typename Method, typename Request, typename Response>
void call(const Connection& conn, moe::v1::Control::Stub& stub, Method method, const Request& req,
          Response* resp) {
  grpc::ClientContext ctx;
  conn.prepare(ctx);
  check((stub.*method)(&ctx, req, resp));
}

using Stub = moe::v1::Control::Stub;

}  // namespace

int run_stats(const ConnectionOptions& options, const StatsArgs& args) {
  const Connection conn(options);
  const auto stub = moe::v1::Control::NewStub(conn.channel());
  // Redrawing in place only makes sense on a terminal; elsewhere each snapshot is appended.
  const bool redraw = args.watch && !args.json && ::isatty(STDOUT_FILENO) != 0;
  for (;;) {
    moe::v1::GetStatsResponse stats;
    call(conn, *stub, &Stub::GetStats, moe::v1::GetStatsRequest(), &stats);
    moe::v1::GetPlacementResponse placement;
    call(conn, *stub, &Stub::GetPlacement, moe::v1::GetPlacementRequest(), &placement);
    std::string text =
        args.json ? format_stats_json(stats, placement) : format_stats_table(stats, placement);
    if (redraw) text = cat("\x1b[H\x1b[2J", text);  // home, clear screen
    if (args.watch && !args.json && !redraw) text += "\n";
    TextOut().write(text);
    if (!args.watch) return 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(args.interval_s));
  }
}

int run_health(const ConnectionOptions& options, const HealthArgs& args) {
  using Clock = std::chrono::system_clock;
  const bool waiting = args.wait_s > 0;
  // Waiting, the channel also retries connecting every 200 ms rather than backing off to seconds.
  const Connection conn(options, waiting ? std::optional(kHealthRetry) : std::nullopt);
  const auto stub = grpc::health::v1::Health::NewStub(conn.channel());
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("");
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(args.wait_s, 0.0)));
  for (;;) {
    grpc::ClientContext ctx;
    // Waiting: the call waits for the channel to connect (instead of failing at once while the
    // server is not up yet), until the end of the wait or --timeout, whichever comes first.
    ctx.set_deadline(waiting ? std::min(end, Clock::now() + conn.timeout())
                             : Clock::now() + conn.timeout());
    ctx.set_wait_for_ready(waiting);
    conn.authorize(ctx);
    HealthStatus resp;
    const grpc::Status status = stub->Check(&ctx, req, &resp);
    const bool serving = status.ok() && resp.status() == HealthStatus::SERVING;
    if (serving || !waiting || Clock::now() + kHealthRetry >= end) {
      check(status);
      std::printf("%s\n", HealthStatus::ServingStatus_Name(resp.status()).c_str());
      return serving ? 0 : 1;
    }
    std::this_thread::sleep_for(kHealthRetry);
  }
}

int run_policy(const ConnectionOptions& options, const PolicyArgs& args) {
  const auto share = [](const char* flag, const std::optional<std::string>& text,
                        std::optional<double>& out) {
    if (!text) return;
    out = model::parse_share(*text);
    if (!out) throw UsageError(cat(flag, ": '", *text, "' is neither auto nor a number in [0, 1]"));
  };
  std::optional<double> stream, direct, prefill;
  share("--stream-share", args.stream_share, stream);
  share("--direct-share", args.direct_share, direct);
  share("--prefill-cpu-share", args.prefill_cpu_share, prefill);
  moe::v1::SetExpertPolicyRequest set;
  if (args.pool_mib) set.set_pool_mib(*args.pool_mib);
  if (stream) set.set_stream_share(*stream);
  if (direct) set.set_direct_share(*direct);
  if (prefill) set.set_prefill_cpu_share(*prefill);
  if (args.profiler) set.set_profiler_new(*args.profiler == "new");
  if (args.grouping) set.set_grouping(*args.grouping == "layout");
  const bool change = set.ByteSizeLong() > 0;

  const Connection conn(options);
  const auto stub = moe::v1::Control::NewStub(conn.channel());
  moe::v1::ExpertPolicyResponse policy;
  if (args.recalibrate)
    call(conn, *stub, &Stub::Recalibrate, moe::v1::RecalibrateRequest(), &policy);
  if (change) {
    call(conn, *stub, &Stub::SetExpertPolicy, set, &policy);
  } else if (!args.recalibrate) {
    call(conn, *stub, &Stub::GetExpertPolicy, moe::v1::GetExpertPolicyRequest(), &policy);
  }
  moe::v1::GetPlacementResponse placement;
  call(conn, *stub, &Stub::GetPlacement, moe::v1::GetPlacementRequest(), &placement);
  TextOut().write(args.json ? format_policy_json(policy, placement)
                            : format_policy(policy, placement));
  return 0;
}

int run_shutdown(const ConnectionOptions& options) {
  const Connection conn(options);
  const auto stub = moe::v1::Control::NewStub(conn.channel());
  moe::v1::ShutdownResponse resp;
  call(conn, *stub, &Stub::Shutdown, moe::v1::ShutdownRequest(), &resp);
  return 0;
}

}  // namespace moe::cli
