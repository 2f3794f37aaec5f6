// libFuzzer harness for the GBNF grammar engine: arbitrary text is parsed as a grammar (limits a
// little smaller than the defaults, so one input stays fast); when it parses, a matcher reads the
// bytes after the first NUL of the input (or a few fixed ones) one call at a time. Every input must
// parse or throw moe::Error, and matching must end or throw moe::Error; a crash, a sanitizer
// report, a hang or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view gbnf = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos
                                    ? std::string_view("{\"a\": [1, \"\xc3\xa9\"]}x")
                                    : input.substr(nul + 1);
  moe::grammar::GrammarLimits limits;
  limits.max_rules = 1024;
  limits.max_elements = 1u << 16;
  limits.max_repeat = 256;
  limits.max_stacks = 256;
  try {
    const auto g = moe::grammar::Grammar::parse(gbnf, "root", limits);
    moe::grammar::GrammarMatcher m(g, nullptr);
    // Byte by byte, then the rest at once: the partial-UTF-8 path and the refusals both run.
    size_t i = 0;
    for (; i < text.size() && i < 64; ++i) {
      if (!m.accept_bytes(text.substr(i, 1))) break;
      (void)m.can_end();
      (void)m.must_end();
    }
    (void)m.accept_bytes(text.substr(i));
    (void)moe::grammar::matches(g, text);
  } catch (const moe::Error&) {
    // refused: fine
  }
  return 0;
}
