// JSON Schema → GBNF: a table of schemas, each with documents its grammar must accept and
// documents it must refuse (checked with the grammar engine's matches()), then what is refused.
#include "coordinator/grammar/json_schema_grammar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"

namespace moe::grammar {
namespace {

using Json = nlohmann::ordered_json;

struct SchemaCase {
  const char* name;
  const char* schema;
  std::vector<std::string> accept;
  std::vector<std::string> refuse;
};

std::string nested(const std::string& open, const std::string& leaf, const std::string& close,
                   int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += open;
  s += leaf;
  for (int i = 0; i < n; ++i) s += close;
  return s;
}

std::string quoted(int n) {
  std::string s(static_cast<size_t>(n) + 2, 'x');
  s.front() = s.back() = '"';
  return s;
}

std::string ints(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += i ? ",1" : "1";
  return s + "]";
}

const std::vector<SchemaCase>& cases() {
  static const std::vector<SchemaCase> kCases = {
      {"tool parameters (required, enum, optional)",
       R"({"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]})",
       {R"({"city": "Paris"})", R"({"city":"Paris","unit":"celsius"})",
        "{\n  \"city\": \"Oslo\",\n  \"unit\": \"fahrenheit\"\n}",
        R"({"city": "Rome", "note": [1, {"a": null}]})"},
       {R"({"unit": "celsius"})", R"({"city": "Paris", "unit": "kelvin"})", R"({"city": 5})",
        R"({"city": "Paris", "unit": 5})", R"({"unit": "celsius", "city": "Paris"})",
        R"({"city": "Paris"} )", R"( {"city": "Paris"})", "{}", ""}},
      {"missing required, wrong type, extra property (additionalProperties false)",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
           "required": ["a"], "additionalProperties": false})",
       {R"({"a": 1})", R"({"a": -7, "b": "x"})", "{ \"a\" : 1 , \"b\" : \"\" }"},
       {"{}", R"({"b": "x"})", R"({"a": "1"})", R"({"a": 1, "c": 2})",
        R"({"a": 1, "b": "x", "a": 2})", R"({"b": "x", "a": 1})", R"({"a": 1,})"}},
      {"additionalProperties schema, never under a listed name",
       R"({"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "string"}})",
       {"{}", R"({"id": 1})", R"({"id": 1, "x": "y", "z": "w"})", R"({"x": "y"})",
        R"({"idx": "s"})", R"({"i": "s"})", R"({"": "empty key"})"},
       {R"({"x": 1})", R"({"id": "s"})", R"({"i\u0064": "s"})", R"({"x": "y", "id": 1})"}},
      {"additionalProperties absent: any value, listed names keep their schema",
       R"({"type": "object", "properties": {"ab": {"type": "boolean"}, "abc": {"type": "null"}}})",
       {R"({"ab": true, "x": [1, 2, {"y": null}]})", R"({"a": 1})", R"({"abcd": 1, "abd": "q"})",
        R"({"ab": false, "abc": null})", R"({"\n": 1})"},
       {R"({"ab": 1})", R"({"abc": 1})", R"({"x": 1, "ab": true})", R"({"a\/b": 1})"}},
      {"required name that is not in properties",
       R"({"type": "object", "properties": {"p": {"type": "integer"}}, "required": ["q"]})",
       {R"({"q": 1})", R"({"p": 2, "q": [true]})", R"({"q": 1, "r": 2})"},
       {"{}", R"({"p": 2})", R"({"r": 2})"}},
      {"string length in characters (escapes and UTF-8 count one)",
       R"({"type": "string", "minLength": 2, "maxLength": 4})",
       {R"("ab")", R"("abcd")", "\"日本語\"", R"("\n\u00e9x")", R"("a\"")", "\"😀😀\"", R"("\\\/")"},
       {R"("a")", R"("abcde")", "\"日本語です!\"", R"("\u00e")", "\"a\tb\"", "ab"}},
      {"string syntax: escapes, unicode, no raw controls",
       R"({"type": "string"})",
       {R"("")", "\"東京 \\\"quoted\\\" \\\\ back\\nslash 😀\"", R"("\ud83d\ude00")",
        R"("\b\f\n\r\t\/")", "\"\x7F\""},
       {R"("abc)", "'abc'", "\"a\nb\"", R"("\x41")", R"("\u12G4")", "\"\x01\"", "null"}},
      {"integer syntax and its 16-digit bound",
       R"({"type": "integer"})",
       {"0", "-5", "1234567890123456", "-9999999999999999"},
       {"01", "1.0", "+1", "12345678901234567", "1e3", "-", "--1", " 1"}},
      {"integer range with negatives",
       R"({"type": "integer", "minimum": -15, "maximum": 130})",
       {"-15", "-9", "-10", "0", "7", "99", "100", "130", "129"},
       {"-16", "-20", "131", "140", "200", "1000", "-0", "00"}},
      {"integer exclusive bounds (numbers and draft 4 flags)",
       R"({"type": "integer", "exclusiveMinimum": 0, "maximum": 1000, "exclusiveMaximum": 100})",
       {"1", "50", "99"},
       {"0", "100", "500", "-1"}},
      {"integer draft 4 exclusive flag and a fractional minimum",
       R"({"type": "integer", "minimum": 4.5, "maximum": 9, "exclusiveMaximum": true})",
       {"5", "8"},
       {"4", "9"}},
      {"number syntax and its bounds",
       R"({"type": "number"})",
       {"0", "-0.5", "3.14e-10", "1E+3", "12.5e300", "1234567890123456.1234567890123456"},
       {".5", "1.", "01.5", "1e", "NaN", "1e1234", "0x10", "12345678901234567",
        "1.12345678901234567"}},
      {"nullable types",
       R"({"type": ["string", "null"], "maxLength": 3})",
       {R"("x")", "null", R"("")"},
       {"1", R"("abcd")", "false", "nul"}},
      {"boolean or integer-or-number",
       R"({"type": ["boolean", "integer", "number"]})",
       {"true", "false", "3", "3.5"},
       {"\"true\"", "null", "[]"}},
      {"enum of any JSON values, as compact JSON",
       R"({"enum": ["a", 1, null, {"k": [true]}, 2.5]})",
       {R"("a")", "1", "null", R"({"k":[true]})", "2.5"},
       {R"("b")", "2", R"({"k": [true]})", "\"A\""}},
      {"enum filtered by type, and const",
       R"({"type": "object", "properties": {"s": {"type": "string", "enum": ["x", 1]}, "c": {"const": "fixed"}},
           "required": ["s", "c"], "additionalProperties": false})",
       {R"({"s": "x", "c": "fixed"})"},
       {R"({"s": 1, "c": "fixed"})", R"({"s": "x", "c": "other"})", R"({"s": "x"})"}},
      {"array items with minItems/maxItems",
       R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
       {"[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1,\n  2\n]"},
       {"[]", "[1,2,3,4]", R"(["a"])", "[1,]", "[,1]"}},
      {"array without items: any values",
       R"({"type": "array"})",
       {"[]", R"([1, "a", null, [{}], {"k": false}])"},
       {"[", "[1 2]", "{}"}},
      {"prefixItems with items false",
       R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
       {"[]", R"(["a"])", R"(["a", 1])"},
       {R"(["a", 1, 2])", "[1]", R"([1, "a"])"}},
      {"prefixItems then items, maxItems",
       R"({"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3})",
       {R"(["x", true])", R"(["x", true, false])"},
       {R"(["x"])", R"(["x", true, false, true])", "[true, true]", R"(["x", 1])"}},
      {"draft 4 tuple items with additionalItems",
       R"({"type": "array", "items": [{"type": "null"}], "additionalItems": {"type": "string"}})",
       {"[]", "[null]", R"([null, "a", "b"])"},
       {R"(["a"])", "[null, null]"}},
      {"nested $ref recursion ($defs)",
       R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
           "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"],
           "additionalProperties": false}}, "$ref": "#/$defs/node"})",
       {R"({"value": 1})",
        R"({"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]})",
        nested(R"({"value": 0, "children": [)", R"({"value": 9})", "]}", 30)},
       {R"({"value": 1, "children": [{"children": []}]})", R"({"value": 1, "children": {}})",
        nested(R"({"value": 0, "children": [)", R"({"value": "9"})", "]}", 10)}},
      {"recursion through the root and anyOf (definitions)",
       R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"$ref": "#/definitions/end"}]}},
           "required": ["next"], "additionalProperties": false, "definitions": {"end": {"type": "null"}}})",
       {R"({"next": null})", R"({"next": {"next": {"next": null}}})"},
       {"{}", R"({"next": 1})", R"({"next": {}})"}},
      {"anyOf alternatives",
       R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 0}]})",
       {R"("ab")", "5", "0"},
       {R"("abc")", "-1", "1.5", "null"}},
      {"oneOf of tagged objects, allOf with one schema",
       R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": {"allOf": [{"type": "integer"}]}},
           "required": ["kind", "n"], "additionalProperties": false},
           {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"], "additionalProperties": false}]})",
       {R"({"kind": "a", "n": 2})", R"({"kind": "b"})"},
       {R"({"kind": "a"})", R"({"kind": "b", "n": 2})", R"({"kind": "c"})"}},
      {"formats date, time, date-time, uuid",
       R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
           "t": {"type": "string", "format": "time"}, "dt": {"type": "string", "format": "date-time"},
           "u": {"type": "string", "format": "uuid"}}, "additionalProperties": false})",
       {R"({"d": "2024-02-29"})", R"({"d": "2000-02-29"})", R"({"d": "2023-12-31"})",
        R"({"d": "2023-04-30"})", R"({"t": "23:59:60.5+05:30"})",
        R"({"dt": "2024-01-15T10:30:00Z"})", R"({"dt": "2024-01-15t10:30:00.123-08:00"})",
        R"({"u": "123e4567-e89b-12d3-A456-426614174000"})"},
       {R"({"d": "2023-02-29"})", R"({"d": "1900-02-29"})", R"({"d": "2024-13-01"})",
        R"({"d": "2024-04-31"})", R"({"d": "2024-1-01"})", R"({"t": "24:00:00Z"})",
        R"({"dt": "2024-01-15T10:30:00"})", R"({"u": "123e4567e89b12d3a456426614174000"})"}},
      {"unicode and quoted property names",
       R"({"type": "object", "properties": {"名前": {"type": "string"}, "a\"b": {"type": "null"}}, "additionalProperties": false})",
       {"{\"名前\": \"太郎\"}", R"({"a\"b": null})", "{\"名前\": \"x\", \"a\\\"b\": null}"},
       {R"({"ab": null})", "{\"名\": \"x\"}"}},
      {"no type: every type under the keywords that apply to it",
       R"({"properties": {"a": {"type": "integer"}}, "required": ["a"], "maxLength": 1})",
       {R"({"a": 1})", "5", R"("s")", "null", "[1]"},
       {R"({"b": 1})", R"("st")", R"({"a": "x"})"}},
      {"empty schema: any JSON value, nesting bounded at 20",
       "{}",
       {"1", R"("s")", "null", "true", R"({"a": [1, 2.5e3, {"b": null}]})", "[]",
        nested("[", "1", "]", 20), nested(R"({"k":)", "1", "}", 20)},
       {"{", "[1,]", "tru", "", R"({"a" 1})", nested("[", "1", "]", 21), "[1]\n", "\"\\\""}},
      {"true schema", "true", {"1", "[]"}, {"x"}},
      {"long bounded strings (written as blocks of 100)",
       R"({"type": "string", "minLength": 150, "maxLength": 10000})",
       {quoted(150), quoted(199), quoted(250), quoted(5099), quoted(9999), quoted(10000)},
       {quoted(149), quoted(10001), quoted(0)}},
      {"long bounded arrays",
       R"({"type": "array", "items": {"type": "integer"}, "maxItems": 300})",
       {"[]", ints(1), ints(100), ints(299), ints(300)},
       {ints(301)}},
      {"whitespace bound: one newline, then at most 20 spaces or tabs",
       R"({"type": "array", "items": {"type": "integer"}})",
       {"[" + std::string(20, ' ') + "1]", "[\n\t\t1\n]", "[1 ,2]"},
       {"[" + std::string(21, ' ') + "1]", "[\n\n1]", "[1\r\n]", "[ \n1]"}},
  };
  return kCases;
}

TEST(JsonSchemaGrammar, TableAcceptsValidAndRefusesInvalid) {
  ASSERT_GE(cases().size(), 20u);
  for (const SchemaCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const Json schema = Json::parse(c.schema);
    std::string gbnf;
    ASSERT_NO_THROW(gbnf = json_schema_to_gbnf(schema)) << c.schema;
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = Grammar::parse(gbnf)) << gbnf;
    for (const std::string& doc : c.accept) {
      EXPECT_TRUE(Json::accept(doc)) << "test bug, not JSON: " << doc;
      EXPECT_TRUE(matches(g, doc)) << "should accept: " << doc << "\n" << gbnf;
    }
    for (const std::string& doc : c.refuse)
      EXPECT_FALSE(matches(g, doc)) << "should refuse: " << doc;
  }
}

// Two schemas under different prefixes share one grammar.
TEST(JsonSchemaGrammar, PrefixesLetSchemasShareAGrammar) {
  const std::string a =
      json_schema_to_gbnf(Json::parse(R"({"type": "integer", "minimum": 5})"), {"a-"});
  const std::string b =
      json_schema_to_gbnf(Json::parse(R"({"type": "array", "items": {"type": "string"}})"), {"b-"});
  EXPECT_EQ(a.find("\nroot ::="), std::string::npos);
  const auto g = Grammar::parse(a + b + "root ::= a-root | b-root\n");
  EXPECT_TRUE(matches(g, "7"));
  EXPECT_TRUE(matches(g, R"(["x", "y"])"));
  EXPECT_FALSE(matches(g, "3"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_THROW(json_schema_to_gbnf(Json::object(), {"bad_prefix"}), Error);
}

TEST(JsonSchemaGrammar, JsonObjectGrammar) {
  const auto g = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"a": [1, {"b": "c"}], "d": null})"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, "1"));
  EXPECT_FALSE(matches(g, R"({"a": })"));
  const auto p = Grammar::parse(json_object_gbnf({"x-"}), "x-root");
  EXPECT_TRUE(matches(p, R"({"k": true})"));
}

// The message names the pointer and what is wrong.
void expect_refused(const std::string& schema, const std::string& pointer,
                    const std::string& what) {
  SCOPED_TRACE(schema);
  try {
    json_schema_to_gbnf(Json::parse(schema));
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("json_schema: " + pointer + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotExpress) {
  expect_refused(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})",
                 "#/properties/a/pattern", "not supported");
  expect_refused(R"({"type": "string", "format": "email"})", "#/format", "not supported");
  expect_refused(R"({"type": "number", "minimum": 0})", "#/minimum", "not supported");
  expect_refused(R"({"type": "integer", "multipleOf": 2})", "#/multipleOf", "not supported");
  expect_refused(R"({"type": "array", "uniqueItems": true})", "#/uniqueItems", "not supported");
  expect_refused(R"({"not": {"type": "null"}})", "#/not", "not supported");
  expect_refused(R"({"type": "object", "minProperties": 1})", "#/minProperties", "not supported");
  expect_refused(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "#/allOf", "one schema");
  expect_refused(R"({"type": "object", "anyOf": [{"required": ["a"]}]})", "#/type",
                 "beside 'anyOf'");
  expect_refused(R"({"$ref": "#/$defs/a", "maxLength": 3, "$defs": {"a": {"type": "string"}}})",
                 "#/maxLength", "beside '$ref'");
  expect_refused(R"({"enum": ["a", "bb"], "maxLength": 1})", "#/maxLength", "beside enum");
  expect_refused(R"({"$ref": "https://example.com/s.json"})", "#/$ref", "local");
  expect_refused(R"({"$ref": "#/$defs/missing"})", "#/$ref", "does not resolve");
  expect_refused(
      R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})",
      "#/$defs/a/anyOf/0/$ref", "left recursion");
  expect_refused(R"({"type": "object", "properties": {"x": false}})", "#/properties/x",
                 "false schema");
  expect_refused(R"({"type": "strin"})", "#/type", "unknown type");
  expect_refused(R"({"type": []})", "#/type", "empty type list");
  expect_refused(R"({"type": "object", "required": ["z"], "additionalProperties": false})",
                 "#/required", "additionalProperties is false");
  expect_refused(R"({"type": "integer", "minimum": 10, "maximum": 5})", "#", "between the bounds");
  expect_refused(R"({"type": "string", "minLength": 5, "maxLength": 2})", "#/maxLength",
                 "less than");
  expect_refused(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})",
                 "#/minItems", "more items");
  expect_refused(R"({"enum": [1, 2], "type": "string"})", "#", "no enum/const value");
  expect_refused(R"({"type": "integer", "minimum": "1"})", "#/minimum", "must be a number");
}

TEST(JsonSchemaGrammar, BoundsTheInputBeforeWalkingIt) {
  expect_refused(R"({"type": "string", "maxLength": 10001})", "#/maxLength", "10000");
  expect_refused(R"({"type": "array", "maxItems": 20000})", "#/maxItems", "10000");
  expect_refused(R"({"type": "array", "minItems": -1})", "#/minItems", "non-negative integer");
  // Depth: 70 nested array schemas (nlohmann parses it; the converter refuses at 64).
  expect_refused(nested(R"({"type": "array", "items": )", "{}", "}", 70),
                 "#" + nested("/items", "", "", 65), "deeper than 64");
  // Rules: 3,000 optional properties take two rules each.
  Json big = {{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 3000; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "p%d", i);
    big["properties"][key] = {{"type", "null"}};
  }
  try {
    json_schema_to_gbnf(big);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4096 grammar rules"), std::string::npos) << e.what();
  }
  // uniqueItems false and annotations are no constraints.
  EXPECT_NO_THROW(json_schema_to_gbnf(Json::parse(
      R"({"type": "array", "uniqueItems": false, "title": "t", "description": "d", "default": [], "examples": [[]],
          "$schema": "https://json-schema.org/draft/2020-12/schema"})")));
}

}  // namespace
}  // namespace moe::grammar
