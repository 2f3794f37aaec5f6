// tokenize, detokenize and template: one unary Generation call each, the answer on stdout.
#include <string>

#include "coordinator/cli/cli_commands.h"
#include "coordinator/cli/cli_error.h"
#include "coordinator/cli/output.h"
#include "moe/v1/generation.grpc.pb.h"

namespace moe::cli {

int run_tokenize(const ConnectionOptions& options, const TokenizeArgs& args) {
  moe::v1::TokenizeRequest req;
  req.set_text(args.text);
  req.set_add_special(args.add_special);
  req.set_parse_special(!args.no_parse_special);
  req.set_with_pieces(args.pieces);

  const Connection conn(options);
  const auto stub = moe::v1::Generation::NewStub(conn.channel());
  grpc::ClientContext ctx;
  conn.prepare(ctx);
  moe::v1::TokenizeResponse resp;
  check(stub->Tokenize(&ctx, req, &resp));

  std::string out;
  if (args.pieces) {
    if (resp.pieces_size() != resp.ids_size()) {
      throw moe::Error(cat("the server sent ", std::to_string(resp.pieces_size()), " pieces for ",
                           std::to_string(resp.ids_size()), " token ids"));
    }
    for (int i = 0; i < resp.ids_size(); ++i)
      out += cat(std::to_string(resp.ids(i)), '\t', escape_bytes(resp.pieces(i)), '\n');
  } else {
    for (int i = 0; i < resp.ids_size(); ++i) {
      if (i > 0) out += " ";
      out += std::to_string(resp.ids(i));
    }
    out += "\n";
  }
  TextOut().write(out);
  return 0;
}

int run_detokenize(const ConnectionOptions& options, const DetokenizeArgs& args) {
  moe::v1::DetokenizeRequest req;
  for (int32_t id : args.ids) req.add_ids(id);
  req.set_skip_special(args.skip_special);

  const Connection conn(options);
  const auto stub = moe::v1::Generation::NewStub(conn.channel());
  grpc::ClientContext ctx;
  conn.prepare(ctx);
  moe::v1::DetokenizeResponse resp;
  check(stub->Detokenize(&ctx, req, &resp));
  TextOut out;
  out.write(resp.text());
  out.end_line_if_tty();
  return 0;
}

int run_template(const ConnectionOptions& options, const TemplateArgs& args) {
  moe::v1::ApplyChatTemplateRequest req;
  *req.mutable_chat() = build_chat_input(args.chat);
  req.mutable_chat()->set_add_generation_prompt(!args.no_generation_prompt);

  const Connection conn(options);
  const auto stub = moe::v1::Generation::NewStub(conn.channel());
  grpc::ClientContext ctx;
  conn.prepare(ctx);
  moe::v1::ApplyChatTemplateResponse resp;
  check(stub->ApplyChatTemplate(&ctx, req, &resp));
  TextOut out;
  out.write(resp.text());
  out.end_line_if_tty();
  return 0;
}

}  // namespace moe::cli
