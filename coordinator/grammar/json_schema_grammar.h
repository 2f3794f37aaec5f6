// JSON Schema → GBNF (the grammar format of grammar.h): response_format json_schema / json_object
// and the arguments of tool calls. The schema comes from a request, so everything is bounded
// before it is walked, and what cannot be expressed exactly is refused, never loosened.
//
// Supported (OpenAI structured outputs' strict subset, plus common extras):
// - `type`: string, number, integer, boolean, null, object, array, or an array of them; no `type`
//   means every type, each under the keywords that apply to it. `{}` and `true` = any JSON value.
// - `enum`, `const`: any JSON values, each matched as its compact JSON text (nlohmann's dump());
//   with `type` beside them, the values of other types are dropped.
// - objects: `properties`, `required`, `additionalProperties` (false: only the listed ones;
//   absent/true: other string keys with any value; a schema: other keys with such values).
//   Properties appear in the schema's order, optional ones may be left out, additional ones come
//   after the listed ones and never use a listed name. A required name that is not in
//   `properties` is listed last, with the additional properties' schema.
// - arrays: `items` (a schema, or false), `prefixItems` (and the older tuple form: `items` as an
//   array with `additionalItems`), `minItems`, `maxItems`.
// - strings: `minLength`/`maxLength` (in characters; an escape sequence is one), `format` date,
//   time, date-time (RFC 3339, leap days exact) and uuid.
// - integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (draft 4's boolean form
//   too), as exact digit ranges.
// - `anyOf` and `oneOf` (both as alternatives: oneOf's "exactly one" is not checked), `allOf` with
//   one element, `$ref` to any local pointer (`#`, `#/$defs/x`, `#/definitions/x`; recursive refs
//   become recursive rules). Annotations (`description`, `title`, `default`, ...) and unknown
//   keywords are ignored, as JSON Schema does.
// Refused (moe::Error "json_schema: #<pointer>: <what>"): `pattern`, other formats, `multipleOf`,
// number (non-integer) bounds, `uniqueItems: true`, `not`, `if`, `contains`, `patternProperties`,
// `propertyNames`, `min/maxProperties`, `dependent*`, `unevaluated*`, remote refs, left-recursive
// refs, `allOf` with several elements, siblings beside `$ref`/`anyOf`/`allOf` that constrain, enum
// with other constraints than `type`, `false` schemas, unsatisfiable schemas.
//
// Bounds of the grammar (what it refuses that JSON allows; nothing a model needs in practice):
// - whitespace between tokens: an optional "\n" then at most 20 spaces/tabs; none around the
//   document;
// - numbers: integer part at most 16 digits, fraction 1..16 digits, exponent 1..3 digits; an
//   integer is written without fraction or exponent ("1.0" is refused for `integer`); "-0" is
//   refused where an integer has bounds;
// - free-form values (`{}`, additional properties, items without a schema): nested at most 20
//   arrays/objects deep;
// - `\u` escapes and `\/` are not allowed in the keys of additional properties (so no such key can
//   spell a listed name).
// Bounds of the input: schema depth 64, 4096 rules, minLength/maxLength/minItems/maxItems and the
// prefixItems count at most 10000 (a long optional span is written as blocks of 100 plus a rest,
// so maxLength 10000 stays within the engine's rule limit).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moe::grammar {

struct SchemaGrammarOptions {
  // Prepended to every rule name the converter writes, so several schemas can share one grammar.
  // Letters, digits and '-' only (GBNF rule names).
  std::string prefix;
};

// GBNF whose rule `<prefix>root` matches exactly the JSON documents valid against `schema` (within
// the bounds above). Takes ordered_json because the order of `properties` is the order the grammar
// asks for (a plain nlohmann::json converts, with its keys sorted). Throws moe::Error
// ("json_schema: #/pointer: what") for what it does not support or what is invalid.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const SchemaGrammarOptions& opt = {});

// GBNF whose `<prefix>root` matches a JSON object with any members (response_format json_object).
std::string json_object_gbnf(const SchemaGrammarOptions& opt = {});

}  // namespace moe::grammar
