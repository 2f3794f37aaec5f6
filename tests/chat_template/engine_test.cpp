// Unit tests of the Jinja engine: table cases checked against Python jinja2 (jinja_cases.h),
// plus error positions, raise_exception, the render inputs, and hostile-template limits.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "coordinator/chat_template/chat_template.h"
#include "tests/chat_template/jinja_cases.h"

namespace moe {
namespace {

using nlohmann::ordered_json;

std::string render(const std::string& src, const ordered_json& messages = ordered_json::array()) {
  ChatTemplateInputs in;
  in.messages = messages;
  return ChatTemplate(src).render(in);
}

// The error message of rendering `src` ("" when it renders).
std::string error_of(const std::string& src, jinja::Limits limits = {}) {
  try {
    ChatTemplate t(src, limits);
    t.render(ChatTemplateInputs{ordered_json::array()});
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

template <size_t N>
void check_cases(const test_cases::JinjaCase (&cases)[N]) {
  const ordered_json messages = ordered_json::parse(test_cases::kMessagesJson);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("template: ") + c.src);
    if (std::string(c.want) == "ERROR") {
      EXPECT_THROW(render(c.src, messages), moe::Error);
      continue;
    }
    try {
      EXPECT_EQ(render(c.src, messages), c.want);
    } catch (const moe::Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

TEST(JinjaCases, Whitespace) { check_cases(test_cases::kWhitespace); }
TEST(JinjaCases, Loops) { check_cases(test_cases::kLoops); }
TEST(JinjaCases, SetAndNamespace) { check_cases(test_cases::kSetAndNamespace); }
TEST(JinjaCases, Macros) { check_cases(test_cases::kMacros); }
TEST(JinjaCases, Expressions) { check_cases(test_cases::kExpressions); }
TEST(JinjaCases, Filters) { check_cases(test_cases::kFilters); }
TEST(JinjaCases, Tests) { check_cases(test_cases::kTests); }
TEST(JinjaCases, Methods) { check_cases(test_cases::kMethods); }
TEST(JinjaCases, Messages) { check_cases(test_cases::kMessages); }

TEST(JinjaInputs, VariablesFromInputs) {
  const ChatTemplate t(
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
      "{{ enable_thinking is defined }}{% if enable_thinking is defined %}={{ enable_thinking }}"
      "{% endif %}|{{ tools|tojson if tools else '' }}");
  ChatTemplateInputs in;
  in.messages = ordered_json::array();
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  EXPECT_EQ(t.render(in), "<s>|</s>|False|True|False|");
  in.add_generation_prompt = true;
  in.enable_thinking = false;
  in.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "x": 1.5}}])");
  EXPECT_EQ(t.render(in),
            "<s>|</s>|True|False|True=False|"
            R"([{"type": "function", "function": {"name": "f", "x": 1.5}}])");
}

TEST(JinjaInputs, JsonValuesPassThrough) {
  // Key order, unicode, escapes, integers vs floats, null and nested arrays survive unchanged.
  const auto msgs = ordered_json::parse(
      R"([{"role": "user", "z": 1, "a": [1.0, 2, null, true], "s": "é\"\n", "big": 12345678901234}])");
  EXPECT_EQ(
      render("{{ messages[0]|tojson }}", msgs),
      R"({"role": "user", "z": 1, "a": [1.0, 2, null, true], "s": "é\"\n", "big": 12345678901234})");
  EXPECT_EQ(render("{{ messages[0].a }}", msgs), "[1.0, 2, None, True]");
}

TEST(JinjaErrors, SyntaxErrorPositions) {
  EXPECT_EQ(error_of("abc\n  {% if %}x{% endif %}"),
            "chat template line 2, column 9: expected an expression, got '%}'");
  EXPECT_EQ(error_of("{{ 1 + }}"),
            "chat template line 1, column 8: expected an expression, got '}}'");
  EXPECT_EQ(error_of("{% for x in y %}"),
            "chat template line 1, column 17: unexpected end of template, expected 'else'");
  EXPECT_EQ(error_of("{{ 'abc }}"), "chat template line 1, column 4: unterminated string literal");
  EXPECT_EQ(error_of("ok {# never closed"), "chat template line 1, column 4: unterminated comment");
  EXPECT_EQ(error_of("{% include 'x' %}"),
            "chat template line 1, column 4: unsupported tag 'include'");
  EXPECT_EQ(error_of("{% frobnicate %}"),
            "chat template line 1, column 4: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{% break %}"), "chat template line 1, column 4: 'break' outside of a loop");
  EXPECT_EQ(error_of("{{ x $ y }}"), "chat template line 1, column 6: unexpected character '$'");
}

TEST(JinjaErrors, UnknownFilterOrTestFailsAtParseTimeEvenInDeadCode) {
  EXPECT_EQ(error_of("{% if false %}\n{{ x|nosuch }}{% endif %}"),
            "chat template line 2, column 6: no filter named 'nosuch'");
  EXPECT_EQ(error_of("{% if false %}{{ x is nosuch }}{% endif %}"),
            "chat template line 1, column 20: no test named 'nosuch'");
}

TEST(JinjaErrors, RuntimeErrorPositions) {
  EXPECT_EQ(error_of("line1\n{{ x.y }}"), "chat template line 2, column 4: 'x' is undefined");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"),
            "chat template line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ none.content.strip() }}"),
            "chat template line 1, column 4: 'None' has no attribute 'content'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"),
            "chat template line 1, column 6: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ 'x' in 1 }}"),
            "chat template line 1, column 4: argument of type 'int' is not iterable");
  EXPECT_EQ(error_of("{{ {}|tojson }}{{ x|tojson }}"),
            "chat template line 1, column 21: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"),
            "chat template line 1, column 24: integer overflow");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplateMessage) {
  const std::string src =
      "{%- for m in messages %}\n"
      "  {%- if m.role == 'system' and not loop.first %}\n"
      "    {{- raise_exception('System message must be at the beginning.') }}\n"
      "  {%- endif %}\n"
      "{%- endfor %}";
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user"}, {"role": "system"}])");
  try {
    ChatTemplate(src).render(in);
    FAIL() << "expected an error";
  } catch (const moe::Error& e) {
    EXPECT_STREQ(e.what(),
                 "chat template line 3, column 9: System message must be at the beginning.");
  }
}

TEST(JinjaErrors, ErrorInsideMacroPointsIntoTheMacro) {
  EXPECT_EQ(error_of("{% macro m() %}\n  {{ 1 / 0 }}\n{% endmacro %}{{ m() }}"),
            "chat template line 2, column 8: division by zero");
}

// --- hostile templates ---------------------------------------------------------------------------

// Small step budgets keep these tests fast; the defaults only scale the time to fail.
jinja::Limits small_steps() {
  jinja::Limits lim;
  lim.max_steps = 500'000;
  return lim;
}

TEST(JinjaLimits, InfiniteLikeLoopsHitTheStepLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err =
      error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
               small_steps());
  EXPECT_NE(err.find("step limit"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(JinjaLimits, RepeatedHugeListsHitTheWorkLimit) {
  const std::string err =
      error_of("{% for i in range(1000) %}{{ range(1000000)|length }}{% endfor %}");
  EXPECT_NE(err.find("work limit"), std::string::npos) << err;
}

TEST(JinjaLimits, HugeRangeIsRejected) {
  EXPECT_NE(error_of("{{ range(10000000000)|length }}").find("range() too long"),
            std::string::npos);
}

TEST(JinjaLimits, StringDoublingHitsTheSizeLimit) {
  jinja::Limits lim;
  lim.max_output_bytes = 1 << 20;
  const std::string err = error_of(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% "
      "endfor %}",
      lim);
  EXPECT_NE(err.find("larger than the limit"), std::string::npos) << err;
  EXPECT_NE(error_of("{{ 'ab' * 10000000000 }}", lim).find("larger than the limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [1] * 10000000000 }}", lim).find("longer than the limit"),
            std::string::npos);
}

TEST(JinjaLimits, OutputSizeLimit) {
  jinja::Limits lim;
  lim.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(1000) %}xx{% endfor %}", lim).find("larger than the limit"),
            std::string::npos);
}

TEST(JinjaLimits, MacroRecursionIsBounded) {
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion depth"),
            std::string::npos);
}

TEST(JinjaLimits, DeepNestingIsRejectedNotACrash) {
  const std::string deep_expr =
      "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(error_of(deep_expr).find("nested too deeply"), std::string::npos);
  std::string deep_blocks;
  for (int i = 0; i < 5000; ++i) deep_blocks += "{% if true %}";
  EXPECT_NE(error_of(deep_blocks).find("nested too deeply"), std::string::npos);
  // A list nested in itself many times (shared, so cheap to build) cannot be built deep.
  EXPECT_NE(error_of("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                     "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}")
                .find("nested too deeply"),
            std::string::npos);
}

TEST(JinjaLimits, ExponentialSharedStructureCannotBePrinted) {
  // 2^40 leaves through sharing: printing, JSON and comparison must stop at the limits.
  const std::string build =
      "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}"
      "{% endfor %}";
  EXPECT_NE(error_of(build + "{{ ns.l }}", small_steps()), "");
  EXPECT_NE(error_of(build + "{{ ns.l|tojson }}", small_steps()), "");
  EXPECT_NE(error_of(build + "{% set ns2 = namespace(l=[1]) %}{% for i in range(40) %}"
                             "{% set ns2.l = [ns2.l, ns2.l] %}{% endfor %}{{ ns.l == ns2.l }}",
                     small_steps()),
            "");
}

TEST(JinjaLimits, SelfReferencingNamespaceDoesNotLeakOrLoop) {
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"),
            "True");
}

}  // namespace
}  // namespace moe
