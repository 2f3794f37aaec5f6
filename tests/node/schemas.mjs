// The structured-output table: JSON Schemas a client may send as response_format json_schema.
// Every string and array is bounded (maxLength, maxItems, enums) because the test models have
// random weights: inside an unbounded string such a model would go on until max_tokens.
const shortString = { type: 'string', maxLength: 12 };

export const schemas = [
  { name: 'flat_object', schema: {
    type: 'object', additionalProperties: false, required: ['name', 'age'],
    properties: { name: shortString, age: { type: 'integer' } } } },
  { name: 'enum_field', schema: {
    type: 'object', additionalProperties: false, required: ['color'],
    properties: { color: { enum: ['red', 'green', 'blue'] } } } },
  { name: 'boolean_and_null', schema: {
    type: 'object', additionalProperties: false, required: ['ok', 'nothing'],
    properties: { ok: { type: 'boolean' }, nothing: { type: 'null' } } } },
  { name: 'number', schema: {
    type: 'object', additionalProperties: false, required: ['x'],
    properties: { x: { type: 'number' } } } },
  { name: 'array_of_ints', schema: {
    type: 'object', additionalProperties: false, required: ['values'],
    properties: { values: { type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 4 } } } },
  { name: 'array_top_level', schema: {
    type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 2, maxItems: 3 } },
  { name: 'nested_object', schema: {
    type: 'object', additionalProperties: false, required: ['user'],
    properties: { user: { type: 'object', additionalProperties: false, required: ['id', 'tag'],
      properties: { id: { type: 'integer' }, tag: shortString } } } } },
  { name: 'optional_properties', schema: {
    type: 'object', additionalProperties: false, required: ['a'],
    properties: { a: { type: 'boolean' }, b: { type: 'integer' }, c: shortString } } },
  { name: 'nullable_type_array', schema: {
    type: 'object', additionalProperties: false, required: ['maybe'],
    properties: { maybe: { type: ['string', 'null'], maxLength: 8 } } } },
  { name: 'any_of', schema: {
    type: 'object', additionalProperties: false, required: ['v'],
    properties: { v: { anyOf: [{ type: 'integer' }, { type: 'boolean' }, { const: 'none' }] } } } },
  { name: 'defs_ref', schema: {
    $defs: { point: { type: 'object', additionalProperties: false, required: ['x', 'y'],
      properties: { x: { type: 'integer' }, y: { type: 'integer' } } } },
    type: 'object', additionalProperties: false, required: ['from', 'to'],
    properties: { from: { $ref: '#/$defs/point' }, to: { $ref: '#/$defs/point' } } } },
  { name: 'recursive_list', schema: {
    $defs: { node: { type: 'object', additionalProperties: false, required: ['v', 'next'],
      properties: { v: { type: 'integer' }, next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } } } },
    $ref: '#/$defs/node' } },
  { name: 'string_lengths', schema: {
    type: 'object', additionalProperties: false, required: ['code'],
    properties: { code: { type: 'string', minLength: 3, maxLength: 5 } } } },
  { name: 'const_and_enum_mix', schema: {
    type: 'object', additionalProperties: false, required: ['kind', 'level'],
    properties: { kind: { const: 'event' }, level: { enum: [1, 2, 3, 'max', null] } } } },
  { name: 'array_of_objects', schema: {
    type: 'object', additionalProperties: false, required: ['items'],
    properties: { items: { type: 'array', maxItems: 3, items: {
      type: 'object', additionalProperties: false, required: ['k'], properties: { k: shortString } } } } } },
  { name: 'one_of_objects', schema: {
    oneOf: [
      { type: 'object', additionalProperties: false, required: ['cat'], properties: { cat: { type: 'boolean' } } },
      { type: 'object', additionalProperties: false, required: ['dog'], properties: { dog: { type: 'integer' } } } ] } },
  { name: 'prefix_items', schema: {
    type: 'array', prefixItems: [{ type: 'integer' }, { enum: ['x', 'y'] }], items: false } },
  { name: 'definitions_keyword', schema: {
    definitions: { flag: { type: 'boolean' } },
    type: 'object', additionalProperties: false, required: ['f'],
    properties: { f: { $ref: '#/definitions/flag' } } } },
];
