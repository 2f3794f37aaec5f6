// moe-tokenize: tokenizes UTF-8 text from stdin with a GGUF model's vocabulary (ids on one line,
// or a JSON array with --json), or with --detokenize turns a JSON array of ids from stdin back
// into text bytes (exactly, no newline added; control tokens rendered).
// Errors go to stderr prefixed "moe-tokenize: error: " with exit code 1; usage errors exit 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

std::string read_stdin() {
  std::string s;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) s.append(buf, n);
  if (std::ferror(stdin)) throw moe::Error("cannot read stdin");
  return s;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(s);
  } catch (const nlohmann::json::parse_error& e) {
    throw moe::Error(std::string("stdin is not JSON: ") + e.what());
  }
  if (!j.is_array()) throw moe::Error("stdin must hold a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
      throw moe::Error("not a token id: " + v.dump());
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void write_all(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) {
    throw moe::Error("cannot write to stdout");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize stdin with a GGUF model's vocabulary", "moe-tokenize"};
  std::string model;
  bool parse_special = false, json = false, detokenize = false;
  app.add_option("-m,--model", model, "GGUF model (a vocab-only file is enough)")->required();
  auto* ps = app.add_flag("--parse-special", parse_special,
                          "Match control-token text such as <|im_start|> as special tokens");
  auto* js = app.add_flag("--json", json, "Print the ids as a JSON array");
  app.add_flag("--detokenize", detokenize, "Read a JSON array of ids, print their text bytes")
      ->excludes(ps)
      ->excludes(js);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? 0 : 2;
  }

  try {
    const auto f = moe::gguf::GgufFile::open(model);
    const auto tok = moe::tokenizer::Tokenizer::from_gguf(f);
    const std::string input = read_stdin();
    if (detokenize) {
      const std::vector<int32_t> ids = parse_ids(input);
      write_all(tok.decode(ids, /*remove_special=*/false, /*unparse_special=*/true));
    } else {
      const std::vector<int32_t> ids = tok.encode(input, parse_special);
      std::string line;
      if (json) {
        line = nlohmann::json(ids).dump();
      } else {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (i) line += ' ';
          line += std::to_string(ids[i]);
        }
      }
      write_all(line + "\n");
    }
    if (std::fflush(stdout) != 0) throw moe::Error("cannot write to stdout");
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "moe-tokenize: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
