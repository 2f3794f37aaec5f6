// moe-cli's commands. Each takes its parsed arguments, makes its calls with the --timeout
// deadline and returns the exit status: 0, 1 (health: not SERVING) or 130 (interrupted by SIGINT).
// A non-OK status is thrown as RpcError, input the client found wrong as UsageError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/cli/chat_input.h"
#include "coordinator/cli/connection.h"
#include "coordinator/sampling/sampling_args.h"

namespace moe::cli {

struct GenerateArgs {
  enum class Input { kText, kTokens, kChat };
  Input input = Input::kText;
  std::string prompt;  // -p
  std::string tokens;  // --tokens "1,2,3"
  ChatSourceArgs chat;
  int32_t n_predict = 0;  // -n; 0 or -1: until end of generation or the context is full
  std::vector<std::string> stop;
  bool ignore_eos = false;
  sampling::SamplingArgs sampling;
  bool show_tokens = false;  // token ids of each chunk on stderr
  bool json = false;         // one JSON object per GenerateResponse on stdout instead of the text
};

struct ChatArgs {
  std::optional<std::string> system;
  int32_t n_predict = 0;
  bool no_think = false;
  sampling::SamplingArgs sampling;
};

struct TokenizeArgs {
  std::string text;
  bool no_parse_special = false;
  bool add_special = false;
  bool pieces = false;  // "id<TAB>piece" lines
};

struct DetokenizeArgs {
  std::vector<int32_t> ids;
  bool skip_special = false;
};

struct TemplateArgs {
  ChatSourceArgs chat;
  bool no_generation_prompt = false;
};

struct StatsArgs {
  bool json = false;
  bool watch = false;  // redraw every `interval_s` until interrupted
  double interval_s = 1;
};

// policy: the routed experts' live policy; with no change it is only read.
struct PolicyArgs {
  std::optional<int64_t> pool_mib;
  std::optional<std::string> stream_share, direct_share, prefill_cpu_share;  // 0..1 or auto
  std::optional<std::string> profiler;                                       // old | new
  std::optional<std::string> grouping;                                       // off | layout
  bool recalibrate = false;                                                  // Recalibrate first
  bool json = false;
};

struct HealthArgs {
  double wait_s = 0;  // > 0: retry every 200 ms until SERVING or this much time passed
};

// Token ids separated by commas (spaces around them allowed), e.g. "1,2, 3". Throws UsageError on
// anything else, an empty list included.
std::vector<int32_t> parse_token_ids(const std::string& list);

// generate_commands.cpp
int run_generate(const ConnectionOptions& conn, const GenerateArgs& args);
int run_chat(const ConnectionOptions& conn, const ChatArgs& args);

// text_commands.cpp
int run_tokenize(const ConnectionOptions& conn, const TokenizeArgs& args);
int run_detokenize(const ConnectionOptions& conn, const DetokenizeArgs& args);
int run_template(const ConnectionOptions& conn, const TemplateArgs& args);

// admin_commands.cpp
int run_stats(const ConnectionOptions& conn, const StatsArgs& args);
int run_health(const ConnectionOptions& conn, const HealthArgs& args);
int run_policy(const ConnectionOptions& conn, const PolicyArgs& args);
int run_shutdown(const ConnectionOptions& conn);

}  // namespace moe::cli
