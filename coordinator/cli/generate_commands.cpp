// generate and chat: Generate calls whose chunks are written as they arrive, a one-line summary
// (like llama.cpp's timings) on stderr, SIGINT cancelling the call.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string_view>

#include "coordinator/cli/cli_commands.h"
#include "coordinator/cli/cli_error.h"
#include "coordinator/cli/interrupt.h"
#include "coordinator/cli/output.h"
#include "moe/v1/generation.grpc.pb.h"

namespace moe::cli {

namespace {

constexpr int kInterruptedStatus = 130;  // 128 + SIGINT, as a shell reports it

struct Display {
  bool json = false;
  bool show_tokens = false;
};

struct Turn {
  bool interrupted = false;
  std::string text;  // everything the chunks carried
  moe::v1::Finish finish;
};

std::string finish_reason_name(const moe::v1::Finish& f) {
  switch (f.reason()) {
    case moe::v1::FINISH_REASON_EOG:
      return "eog";
    case moe::v1::FINISH_REASON_LENGTH:
      return "length";
    case moe::v1::FINISH_REASON_STOP_STRING:
      return cat("stop string \"", escape_bytes(f.stop_string()), '"');
    case moe::v1::FINISH_REASON_CONTEXT:
      return "context full";
    default:
      return cat("unspecified (", std::to_string(static_cast<int>(f.reason())), ')');
  }
}

void print_summary(const moe::v1::Finish& f) {
  const moe::v1::Timings& t = f.timings();
  std::fprintf(stderr,
               "moe-cli: finish: %s | prompt: %d tokens, %.2f ms, %.2f tok/s | generation: %d "
               "tokens, %.2f ms, %.2f tok/s | queue: %.2f ms | seed: %u\n",
               finish_reason_name(f).c_str(), f.prompt_tokens(), t.prompt_ms(),
               t.prompt_tokens_per_second(), f.completion_tokens(), t.generation_ms(),
               t.tokens_per_second(), t.queue_ms(), f.seed());
}

void print_token_ids(const moe::v1::Chunk& chunk) {
  std::string line = "tokens:";
  for (int32_t id : chunk.token_ids()) line += cat(' ', std::to_string(id));
  line += "\n";
  std::fputs(line.c_str(), stderr);
}

// One Generate call, written to `out` as the messages arrive. Throws RpcError on a non-OK status
// unless SIGINT cancelled the call (then Turn::interrupted).
Turn stream(const Connection& conn, moe::v1::Generation::Stub& stub,
            const moe::v1::GenerateRequest& req, const Display& display, TextOut& out,
            InterruptGuard& guard) {
  grpc::ClientContext ctx;
  conn.prepare(ctx);
  ScopedWatch watch(guard, ctx);
  Turn turn;
  bool finished = false;
  const auto reader = stub.Generate(&ctx, req);
  moe::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (display.json) out.write(to_json(resp) + "\n");
    if (resp.has_chunk()) {
      const moe::v1::Chunk& chunk = resp.chunk();
      turn.text += chunk.text();
      if (!display.json) out.write(chunk.text());
      if (display.show_tokens) print_token_ids(chunk);
    } else if (resp.has_finish()) {
      turn.finish = resp.finish();
      finished = true;
    }
  }
  const grpc::Status status = reader->Finish();
  if (guard.interrupted()) {
    turn.interrupted = true;
    return turn;
  }
  check(status);
  if (!finished) throw moe::Error("the server ended the stream without a Finish message");
  return turn;
}

}  // namespace

std::vector<int32_t> parse_token_ids(const std::string& list) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  for (;;) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    std::string_view item(list.data() + pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t id = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      throw UsageError(cat("--tokens: \"", item,
                           "\" is not a token id (expected comma-separated integers, e.g. 1,2,3)"));
    }
    ids.push_back(id);
    if (comma == list.size()) return ids;
    pos = comma + 1;
  }
}

int run_generate(const ConnectionOptions& options, const GenerateArgs& args) {
  moe::v1::GenerateRequest req;
  switch (args.input) {
    case GenerateArgs::Input::kText:
      req.set_text(args.prompt);
      break;
    case GenerateArgs::Input::kTokens:
      for (int32_t id : parse_token_ids(args.tokens)) req.mutable_tokens()->add_ids(id);
      break;
    case GenerateArgs::Input::kChat:
      *req.mutable_chat() = build_chat_input(args.chat);
      req.mutable_chat()->set_add_generation_prompt(true);
      break;
  }
  args.sampling.apply(req);
  req.set_max_tokens(args.n_predict == -1 ? 0 : args.n_predict);
  for (const std::string& s : args.stop) req.add_stop(s);
  req.set_ignore_eos(args.ignore_eos);

  const Connection conn(options);
  const auto stub = moe::v1::Generation::NewStub(conn.channel());
  TextOut out;
  InterruptGuard guard;
  const Turn turn = stream(conn, *stub, req,
                           Display{.json = args.json, .show_tokens = args.show_tokens}, out, guard);
  out.end_line_if_tty();
  if (turn.interrupted) return kInterruptedStatus;
  print_summary(turn.finish);
  return 0;
}

int run_chat(const ConnectionOptions& options, const ChatArgs& args) {
  moe::v1::ChatInput start;
  if (args.system) add_message(start, "system", *args.system);
  moe::v1::GenerateRequest base;
  args.sampling.apply(base);
  base.set_max_tokens(args.n_predict == -1 ? 0 : args.n_predict);

  const Connection conn(options);
  const auto stub = moe::v1::Generation::NewStub(conn.channel());
  const bool interactive = isatty(STDIN_FILENO) != 0;
  TextOut out;
  moe::v1::ChatInput history = start;
  std::string line;
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) {
      if (interactive) std::fputs("\n", stderr);
      return 0;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") return 0;
    if (line == "/reset") {
      history = start;
      if (interactive) std::fputs("moe-cli: conversation cleared\n", stderr);
      continue;
    }
    if (line.empty()) continue;

    moe::v1::GenerateRequest req = base;
    moe::v1::ChatInput& chat = *req.mutable_chat();
    chat = history;
    add_message(chat, "user", line);
    chat.set_add_generation_prompt(true);
    if (args.no_think) chat.set_enable_thinking(false);
    Turn turn;
    {
      InterruptGuard guard;  // only while the call runs: at the prompt SIGINT ends the process
      turn = stream(conn, *stub, req, Display{}, out, guard);
    }
    out.end_line();
    if (turn.interrupted) return kInterruptedStatus;
    print_summary(turn.finish);
    add_message(history, "user", line);
    add_message(history, "assistant", turn.text);
  }
}

}  // namespace moe::cli
