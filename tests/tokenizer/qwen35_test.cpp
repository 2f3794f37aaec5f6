// qwen35 pre-tokenizer on the tiny qwen35moe models: prompts/raw.txt and prompts/chat.txt must
// give llama.cpp's prompt tokens (parse_special = true; Qwen adds no BOS).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/testdata.h"
#include "tests/tokenizer/tokenizer_testing.h"

namespace {

namespace fs = std::filesystem;
using moe::test::ids_str;

fs::path qwen35_dir() { return moe::test::qwen35moe_testdata_dir(); }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// From the folder's README §6.
const std::vector<int32_t> kRaw = {785, 272, 391,  275, 278, 315, 434,  81,  681, 374,
                                   393, 277, 285,  13,  576, 272, 391,  275, 278, 315,
                                   479, 261, 1515, 88,  374, 425, 261,  75,  258, 13,
                                   576, 272, 391,  275, 278, 315, 1084, 278, 88,  374};
const std::vector<int32_t> kChat = {
    2049, 82,  612, 198,  56,   283, 525, 264,  1492, 1262, 1071, 380, 517, 13,  2050, 198,  2049,
    872,  198, 54,  1247, 264,  305, 64,  1579, 84,   911,  296,  941, 83,  552, 12,   1055, 12,
    327,  79,  529, 82,   1614, 82,  13,  2050, 198,  2049, 395,  380, 517, 198, 2072, 198};

TEST(TokenizerQwen35, PromptTokens) {
  const fs::path dir = qwen35_dir();
  const std::string raw = read_file(dir / "prompts" / "raw.txt");
  const std::string chat = read_file(dir / "prompts" / "chat.txt");
  for (const char* stem :
       {"tiny-qwen35moe-sv-F16", "tiny-qwen35moe-sv-Q8_0", "tiny-qwen35moe-sv-Q4_K_M"}) {
    SCOPED_TRACE(stem);
    const auto tok = moe::test::load_tokenizer(dir / "models" / (std::string(stem) + ".gguf"));
    EXPECT_EQ(tok.vocab().pre(), moe::tokenizer::PreTokenizer::kQwen35);
    EXPECT_EQ(tok.vocab().pre_name(), "qwen35");
    EXPECT_FALSE(tok.add_bos());
    const auto raw_ids = tok.encode(raw, true);
    const auto chat_ids = tok.encode(chat, true);
    EXPECT_EQ(raw_ids, kRaw) << ids_str(raw_ids);
    EXPECT_EQ(chat_ids, kChat) << ids_str(chat_ids);
    const fs::path golden = dir / "golden" / stem;
    EXPECT_EQ(raw_ids, moe::test::read_raw<int32_t>(golden / "raw" / "prompt_tokens.i32"));
    EXPECT_EQ(chat_ids, moe::test::read_raw<int32_t>(golden / "chat" / "prompt_tokens.i32"));
    // Round trip back to the prompt text.
    EXPECT_EQ(tok.decode(chat_ids, false, true), chat);
  }
}

}  // namespace
