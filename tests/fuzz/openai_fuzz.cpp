// libFuzzer harness for the OpenAI-compatible HTTP API: a request body takes the path
// HttpServer::generation() gives it (parse_json_body, chat_completion_request or
// completion_request, server::to_job_request). For a chat that renders the messages and tools with
// the real Qwen3 chat template and tokenizes the prompt with the real Qwen3 vocabulary, both read
// from $MOE_TESTDATA/models/qwen3-vocab-only.gguf. Every body must give a job request or throw
// moe::Error (HttpError, BadRequest); a crash, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/chat_template/chat_template.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/server/request_validation.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

struct Model {
  moe::gguf::GgufFile file;
  moe::tokenizer::Tokenizer tok;
  moe::ChatTemplate chat_template;
  moe::server::ModelLimits limits;

  explicit Model(moe::gguf::GgufFile f)
      : file(std::move(f)),
        tok(moe::tokenizer::Tokenizer::from_gguf(file)),
        chat_template(std::string(file.require_string("tokenizer.chat_template"))) {
    limits.tok = &tok;
    limits.chat_template = &chat_template;
    limits.n_ctx = 40960;  // Qwen3's trained context
  }
};

std::unique_ptr<Model> g_model;

std::filesystem::path vocab_path() {
  const char* env = std::getenv("MOE_TESTDATA");
  const std::filesystem::path dir = (env && *env) ? env : MOE_TESTDATA_DEFAULT;
  return dir / "models" / "qwen3-vocab-only.gguf";
}

// The prompt is what the request asked for: ids within the vocabulary and the context, and for a
// text prompt the exact text back when detokenized (byte-level BPE loses nothing; special tokens
// are parsed, so they are rendered back).
void check(const moe::v1::GenerateRequest& req, const moe::engine::JobRequest& job) {
  const Model& m = *g_model;
  if (job.prompt.empty() || static_cast<int64_t>(job.prompt.size()) >= m.limits.n_ctx) {
    __builtin_trap();
  }
  for (int32_t id : job.prompt) {
    if (id < 0 || id >= m.tok.n_vocab()) __builtin_trap();
  }
  if (req.input_case() == moe::v1::GenerateRequest::kText) {
    std::span<const int32_t> ids(job.prompt);
    if (m.tok.add_bos()) ids = ids.subspan(1);
    if (m.tok.decode(ids, /*remove_special=*/false, /*unparse_special=*/true) != req.text()) {
      __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::filesystem::path path = vocab_path();
  try {
    g_model = std::make_unique<Model>(moe::gguf::GgufFile::open(path.string()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "openai_fuzz: cannot load %s (set MOE_TESTDATA): %s\n",
                 path.string().c_str(), e.what());
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body_text(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json body;
  try {
    body = moe::http::parse_json_body(body_text);
  } catch (const moe::Error&) {
    return 0;
  }
  // Both endpoints: each refuses the other's body early, so this costs little.
  for (const bool chat : {true, false}) {
    try {
      moe::http::OpenAiOptions opts;
      const moe::v1::GenerateRequest req = chat ? moe::http::chat_completion_request(body, &opts)
                                                : moe::http::completion_request(body, &opts);
      check(req, moe::server::to_job_request(req, g_model->limits));
    } catch (const moe::Error&) {
    }
  }
  return 0;
}
