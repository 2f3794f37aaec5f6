// moe-cli: the terminal client of the coordinator's gRPC API. This file declares the command line
// and dispatches; the commands live in *_commands.cpp.
//
//   moe-cli [--addr HOST:PORT] [--timeout SECONDS] COMMAND ...
//
// Exit status: 0 success, 1 a non-OK status (printed as "moe-cli: CODE_NAME: message") or health
// not SERVING, 2 a usage error, 130 generate/chat interrupted by SIGINT.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "coordinator/cli/cli_commands.h"
#include "coordinator/cli/cli_error.h"
#include "coordinator/residency/expert_policy.h"

namespace {

using namespace moe::cli;

constexpr int kUsageStatus = 2;

// An option that stores its value in `dst` when given (so that "given as empty" is not "absent").
CLI::Option* add_optional(CLI::App& app, const std::string& name, std::optional<std::string>& dst,
                          const std::string& help) {
  return app.add_option_function<std::string>(
      name, [&dst](const std::string& v) { dst = v; }, help);
}

struct ChatOptions {
  CLI::Option* user = nullptr;
  CLI::Option* system = nullptr;
  CLI::Option* messages = nullptr;
  CLI::Option* tools = nullptr;
  CLI::Option* no_think = nullptr;
};

// --chat-user TEXT [--system TEXT] | --messages FILE, and --tools FILE, --no-think.
ChatOptions add_chat_options(CLI::App& app, ChatSourceArgs& a) {
  ChatOptions o;
  o.user = add_optional(app, "--chat-user", a.user, "a chat: this user message");
  o.system = add_optional(app, "--system", a.system, "with --chat-user: a system message first");
  o.messages = add_optional(app, "--messages", a.messages_path,
                            "a chat: the messages of this JSON file (array of {role, content, "
                            "reasoning_content, tool_calls, tool_call_id, name})")
                   ->type_name("FILE");
  o.tools = add_optional(app, "--tools", a.tools_path,
                         "with a chat: tool definitions from this JSON file (array of objects)")
                ->type_name("FILE");
  o.no_think = app.add_flag("--no-think", a.no_think, "with a chat: enable_thinking = false");
  o.system->needs(o.user);
  o.user->excludes(o.messages);
  return o;
}

// --tools and --no-think only mean something with a chat.
void check_chat_modifiers(const ChatOptions& o, const ChatSourceArgs& a) {
  if (!a.given() && (o.tools->count() > 0 || o.no_think->count() > 0))
    throw CLI::ValidationError("--tools and --no-think need --chat-user or --messages");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Client of the moe-runtime coordinator's gRPC API", "moe-cli"};
  app.require_subcommand(1);
  ConnectionOptions conn;
  app.add_option("--addr", conn.addr, "coordinator address")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  app.add_option("--timeout", conn.timeout_s, "deadline of each call in seconds (chat: each turn)")
      ->capture_default_str()
      ->type_name("SECONDS")
      ->check(CLI::Range(1e-3, 1e9).description(""));
  app.add_option("--api-key", conn.api_key,
                 "the coordinator's API key (default: the environment's MOE_API_KEY)")
      ->envname("MOE_API_KEY");

  // generate
  GenerateArgs gen;
  CLI::App* gen_cmd =
      app.add_subcommand("generate", "generate text, streamed to stdout as it arrives");
  auto* prompt = gen_cmd->add_option("-p,--prompt", gen.prompt, "the prompt text");
  auto* tokens = gen_cmd->add_option("--tokens", gen.tokens, "the prompt as token ids: 1,2,3")
                     ->type_name("IDS");
  const ChatOptions gen_chat = add_chat_options(*gen_cmd, gen.chat);
  prompt->excludes(tokens)->excludes(gen_chat.user)->excludes(gen_chat.messages);
  tokens->excludes(gen_chat.user)->excludes(gen_chat.messages);
  gen_cmd
      ->add_option("-n,--n-predict", gen.n_predict,
                   "tokens to generate at most (0 or -1: until end of generation)")
      ->type_name("N");
  gen_cmd->add_option("--stop", gen.stop, "stop string (repeatable)")
      ->type_name("S")
      ->allow_extra_args(false);
  gen_cmd->add_flag("--ignore-eos", gen.ignore_eos, "keep going after end-of-generation tokens");
  gen.sampling.add_options(*gen_cmd);
  gen_cmd->add_flag("--show-tokens", gen.show_tokens, "the token ids of each chunk on stderr");
  gen_cmd->add_flag("--json", gen.json,
                    "one JSON object per received message (chunk/finish) on stdout instead of "
                    "the text");

  // chat
  ChatArgs chat;
  CLI::App* chat_cmd = app.add_subcommand(
      "chat", "interactive chat: one user turn per line of stdin; /reset, /exit");
  add_optional(*chat_cmd, "--system", chat.system, "system message");
  chat_cmd
      ->add_option("-n,--n-predict", chat.n_predict,
                   "tokens to generate at most per reply (0 or -1: until end of generation)")
      ->type_name("N");
  chat_cmd->add_flag("--no-think", chat.no_think, "enable_thinking = false");
  chat.sampling.add_options(*chat_cmd);

  // tokenize
  TokenizeArgs tok;
  CLI::App* tok_cmd = app.add_subcommand("tokenize", "token ids of a text");
  tok_cmd->add_option("TEXT", tok.text, "the text")->required();
  tok_cmd->add_flag("--no-parse-special", tok.no_parse_special,
                    "\"<|im_start|>\" etc. stay text rather than special tokens");
  tok_cmd->add_flag("--add-special", tok.add_special, "prepend BOS when the model wants it");
  tok_cmd->add_flag("--pieces", tok.pieces,
                    "one \"id<TAB>piece\" line per token (bytes that are not printable as \\xNN)");

  // detokenize
  DetokenizeArgs detok;
  CLI::App* detok_cmd = app.add_subcommand("detokenize", "the text of token ids");
  detok_cmd->add_option("ID", detok.ids, "token ids (separated by spaces or commas)")
      ->type_name("ID")
      ->required()
      ->delimiter(',');
  detok_cmd->add_flag("--skip-special", detok.skip_special, "drop special tokens' text");

  // template
  TemplateArgs tmpl;
  CLI::App* tmpl_cmd =
      app.add_subcommand("template", "the prompt the model's chat template renders for a chat");
  const ChatOptions tmpl_chat = add_chat_options(*tmpl_cmd, tmpl.chat);
  tmpl_cmd->add_flag("--no-generation-prompt", tmpl.no_generation_prompt,
                     "without the assistant turn's opening at the end");

  // stats
  StatsArgs stats;
  CLI::App* stats_cmd = app.add_subcommand("stats",
                                           "counters, queue, throughput and workers (GetStats, "
                                           "GetPlacement)");
  stats_cmd->add_flag("--json", stats.json, "as one JSON object");
  stats_cmd->add_flag("--watch", stats.watch,
                      "live view: redraw the table (per-layer hits, misses, expert time) until "
                      "Ctrl-C; with --json, one object per interval");
  stats_cmd->add_option("--interval", stats.interval_s, "seconds between redraws (default 1)")
      ->check(CLI::Range(0.1, 3600.0));

  // policy
  PolicyArgs policy;
  CLI::App* policy_cmd = app.add_subcommand(
      "policy",
      "the routed experts' live policy on a GPU with CPU-homed experts, and each layer's split "
      "(GetExpertPolicy, GetPlacement); the options change it between decode steps "
      "(SetExpertPolicy, Recalibrate)");
  policy_cmd->add_option("--pool-mib", policy.pool_mib, "resize the VRAM pool (0: none)")
      ->type_name("MIB")
      ->check(CLI::Range(int64_t{0}, moe::model::kMaxPoolMib));
  policy_cmd
      ->add_option("--stream-share", policy.stream_share,
                   "share of a decode layer's misses copied over PCIe, or auto")
      ->type_name("SHARE|auto");
  policy_cmd
      ->add_option("--direct-share", policy.direct_share,
                   "share of a decode layer's misses the GPU reads in place, or auto")
      ->type_name("SHARE|auto");
  policy_cmd
      ->add_option("--prefill-cpu-share", policy.prefill_cpu_share,
                   "share of a prefill layer's streamed experts the CPU computes, or auto")
      ->type_name("SHARE|auto");
  policy_cmd->add_option("--profiler", policy.profiler, "the miss profiler: old or new")
      ->check(CLI::IsMember({"old", "new"}));
  policy_cmd->add_option("--grouping", policy.grouping, "the pool's grouping: off or layout")
      ->check(CLI::IsMember({"off", "layout"}));
  policy_cmd->add_flag("--recalibrate", policy.recalibrate,
                       "measure the machine's rates again (PCIe, GPU and CPU time per expert)");
  policy_cmd->add_flag("--json", policy.json, "as one JSON object");

  // health
  HealthArgs health;
  CLI::App* health_cmd =
      app.add_subcommand("health", "grpc.health.v1 Check; exit status 0 only when SERVING");
  health_cmd
      ->add_option("--wait", health.wait_s,
                   "wait for the server and retry every 200 ms until SERVING, at most this long")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 1e9).description(""));

  // shutdown
  CLI::App* shutdown_cmd =
      app.add_subcommand("shutdown", "drain, then stop the coordinator and its workers");

  for (CLI::App* sub : app.get_subcommands({})) sub->fallthrough();

  try {
    app.parse(argc, argv);
    if (gen_cmd->parsed()) {
      check_chat_modifiers(gen_chat, gen.chat);
      if (prompt->count() > 0)
        gen.input = GenerateArgs::Input::kText;
      else if (tokens->count() > 0)
        gen.input = GenerateArgs::Input::kTokens;
      else if (gen.chat.given())
        gen.input = GenerateArgs::Input::kChat;
      else
        throw CLI::RequiredError("one of -p, --tokens, --chat-user or --messages");
    }
    if (tmpl_cmd->parsed()) {
      check_chat_modifiers(tmpl_chat, tmpl.chat);
      if (!tmpl.chat.given()) throw CLI::RequiredError("--chat-user or --messages");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageStatus;
  }

  try {
    if (gen_cmd->parsed()) return run_generate(conn, gen);
    if (chat_cmd->parsed()) return run_chat(conn, chat);
    if (tok_cmd->parsed()) return run_tokenize(conn, tok);
    if (detok_cmd->parsed()) return run_detokenize(conn, detok);
    if (tmpl_cmd->parsed()) return run_template(conn, tmpl);
    if (stats_cmd->parsed()) return run_stats(conn, stats);
    if (health_cmd->parsed()) return run_health(conn, health);
    if (policy_cmd->parsed()) return run_policy(conn, policy);
    if (shutdown_cmd->parsed()) return run_shutdown(conn);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moe-cli: %s\n", e.what());
    return kUsageStatus;
  } catch (const RpcError& e) {
    std::fprintf(stderr, "moe-cli: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-cli: error: %s\n", e.what());
    return 1;
  }
  return kUsageStatus;  // unreachable: require_subcommand(1)
}
