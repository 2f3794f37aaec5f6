// Engine cases whose expected output was produced by Python jinja2 3.1.6 configured as HF
// apply_chat_template does (trim_blocks, lstrip_blocks, loopcontrols, json.dumps tojson).
// `messages` is kMessagesJson below; "ERROR" means jinja2 raised, so render must throw.
#pragma once

namespace moe::test_cases {

struct JinjaCase {
  const char* src;
  const char* want;
};

inline constexpr const char* kMessagesJson =
    R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}])";

inline constexpr JinjaCase kWhitespace[] = {
    {"a\n{% if true %}\nb\n{% endif %}\nc", "a\nb\nc"},
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc"},
    {"a  {% if true %}b{% endif %}  c", "a  b  c"},
    {"x\n    {%- if true %} y {% endif -%}\n  z", "x y z"},
    {"{{ 'a' }}\n{{ 'b' }}\n", "a\nb"},
    {"a\n  {{- 'b' -}}  \nc", "abc"},
    {"  {%+ if true %}x{% endif %}\n", "  x"},
    {"{% if true +%}\nx{% endif %}", "\nx"},
    {"a\n  {# comment #}\nb", "a\nb"},
    {"a {# c #} b", "a  b"},
    {"  {% raw %}\n  {{ x }}{% if %}\n  {% endraw %}\nz", "\n  {{ x }}{% if %}\nz"},
    {"{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", "  1\n  2\n"},
    {"line1\r\nline2\r\n", "line1\nline2"},
    {"{% set x = 1 %}  {{ x }}", "  1"},
    {"{{ 1 }}  {% if true %}y{% endif %}", "1  y"},
    {"\t{% if true %}\tx{% endif %}", "\tx"},
};

inline constexpr JinjaCase kLoops[] = {
    {"{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
     "loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"{% for x in [1,2,3] %}{{ loop.previtem is defined }}{{ loop.previtem }}-{{ loop.nextitem "
     "}};{% endfor %}",
     "False-2;True1-3;True2-;"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for x in [1,2,3,4] if x is odd %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}",
     "1232"},
    {"{% for k, v in {'a': 1, 'b': 2}|items %}{{ k }}={{ v }},{% endfor %}", "a=1,b=2,"},
    {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}", "a=1,b=2,"},
    {"{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break "
     "%}{% endif %}{{ x }}{% endfor %}",
     "13"},
    {"{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index "
     "}};{% endfor %}",
     "121;122;123;"},
    {"{% for x in 'héy' %}[{{ x }}]{% endfor %}", "[h][é][y]"},
    {"{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", "ba"},
    {"{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{% endfor %}", "aba"},
    {"{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %}{{ x }}",
     "innerouter"},
    {"{% for i in [1,2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}", "[]"},
    {"{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{{ range(2, 5)|list }}", "531[2, 3, 4]"},
    {"{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "37"},
};

inline constexpr JinjaCase kSetAndNamespace[] = {
    {"{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set "
     "ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
     "6 0123"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"},
    {"{% set x %}Hello {{ 'World' }}{% endset %}[{{ x }}]", "[Hello World]"},
    {"{% set x | upper %}abc{% endset %}{{ x }}", "ABC"},
    {"{% if true %}{% set x = 5 %}{% endif %}{{ x }}", "5"},
    {"{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}", "12False"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "3[]"},
    {"{% set d = dict(x=1, y='z') %}{{ d.x }}{{ d['y'] }}{{ d|tojson }}",
     "1z{\"x\": 1, \"y\": \"z\"}"},
};

inline constexpr JinjaCase kMacros[] = {
    {"{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ "
     "greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet('X', 'Yo') }}",
     "Hello, Bob! Hi, Al! Yo, X!"},
    {"{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}", "xx!"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
     "1(2, 3){'k': 4}"},
    {"{% macro m(x) %}  {{ x }}  {% endmacro %}[{{ m(1)|trim }}]", "[1]"},
    {"{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inside{% endcall %}",
     "<inside>"},
    {"{% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% "
     "call(x) list([1,2]) %}[{{ x }}]{% endcall %}",
     "[1][2]"},
    {"{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", "global"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
     "321"},
    {"{% macro m(a) %}{{ a is defined }}{% endmacro %}{{ m() }}", "False"},
};

inline constexpr JinjaCase kExpressions[] = {
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 "
     "** 10 }} {{ 7 / 2 }} {{ 4 / 2 }}",
     "7 9 3 -4 1 2 1024 3.5 2.0"},
    {"{{ -2 ** 2 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} "
     "{{ 0.0001 }} {{ 0.00001 }} {{ 3.0 }} {{ -0.0 }}",
     "4 0.5 2.5 0.30000000000000004 1e+20 1e+16 1000000000000000.0 0.0001 1e-05 3.0 -0.0"},
    {"{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ [0] * 3 }}",
     "ab a1NoneTrue ababab [1, 2] [0, 0, 0]"},
    {"{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1,2] == "
     "[1,2] }} {{ 'b' > 'a' }}",
     "True False True True True True True"},
    {"{{ 'ell' in 'hello' }} {{ 2 in [1,2] }} {{ 'a' in {'a': 1} }} {{ 'z' not in 'abc' }} {{ 3 "
     "not in [1] }}",
     "True True True True True"},
    {"{{ true and 'x' }} {{ false or 'y' }} {{ none or 0 }} {{ not 0 }} {{ not [] }} {{ 'a' and '' "
     "}}|",
     "x y 0 True True |"},
    {"{{ 'yes' if 1 > 0 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'x' if false }}]", "yes no []"},
    {"{{ [1, 2, 3][-1] }} {{ [1,2,3,4,5][1:3] }} {{ [1,2,3,4,5][::-1] }} {{ [1,2,3,4,5][::2] }} {{ "
     "[1,2,3,4,5][-2:] }} {{ 'hello'[1:-1] }} {{ 'héllo'[::-1] }} {{ [1,2,3][5:] }}",
     "3 [2, 3] [5, 4, 3, 2, 1] [1, 3, 5] [4, 5] ell olléh []"},
    {"{{ {'a': {'b': [10, 20]}}.a.b[1] }} {{ {'a': 1}['a'] }} {{ [[1,2]].0.1 }} {{ (1, 2) }} {{ "
     "(1,) }} {{ () }}",
     "20 1 2 (1, 2) (1,) ()"},
    {"{{ none }} {{ true }} {{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }} {{ {'a': [1]} }}",
     "None True [1, 'a', None, True, 1.5, {'k': \"it's\"}] {'a': [1]}"},
    {"{{ 'a' 'b' }} {{ \"tab\\there\" }} {{ 'q\\'s' }} {{ '\\u00e9\\x41' }} {{ 'line\\\\n' }}",
     "ab tab\there q's éA line\\n"},
    {"{{ [1,2,3]|length }} {{ 'héllo'|length }} {{ {'a': 1}|length }} {{ undefined_thing|length }}",
     "3 5 1 0"},
    {"{{ 1_000 + 1 }} {{ 1.5e3 }} {{ 10 - 3 - 2 }} {{ 2 * 3 % 4 }} {{ 'a' ~ 2 + 3 }}", "ERROR"},
    {"{{ -3|abs }} {{ (-3)|abs }} {{ not true|string }}", "3 3 False"},
};

inline constexpr JinjaCase kFilters[] = {
    {"{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize "
     "}}|{{ 'Ab'|lower }}{{ 'Ab'|upper }}",
     "x|a|Hello World|Hello|abAB"},
    {"{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ "
     "['b','A','c']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}",
     "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] [{'n': 1}, {'n': 2}]"},
    {"{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ []|first is defined }} {{ "
     "[1,2,3]|join(', ') }} {{ [1,2]|join }}",
     "1 3 a False 1, 2, 3 12"},
    {"{{ 'abc'|list }} {{ {'a': 1}|list }} {{ [1,2]|reverse|list }} {{ 'abc'|reverse }} {{ "
     "[1,2,1,3,2]|unique|list }} {{ ['a','A','b']|unique|list }}",
     "['a', 'b', 'c'] ['a'] [2, 1] cba [1, 2, 3] ['a', 'b']"},
    {"{{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ "
     "'0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }}",
     "43 3 0 7 3 26 2.5 0.0 3.0"},
    {"{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 1.23456|round(3) }} {{ "
     "2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }}",
     "2.0 4.0 2.67 3 1.235 3.0 2.0"},
    {"{{ undefined_x|default('dflt') }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ "
     "none|d('n') }} {{ 0|default(5, boolean=true) }}",
     "dflt  e None 5"},
    {"{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '.') }}",
     "a+b+c bba .a.b."},
    {"{{ [{'a': 1}, {'a': 2}, {'b': 3}]|selectattr('a')|list }} {{ [{'a': 1}, {'a': "
     "2}]|selectattr('a', 'equalto', 2)|list }} {{ [{'a': 1}, {'a': 2}]|rejectattr('a', 'eq', "
     "2)|list }}",
     "[{'a': 1}, {'a': 2}] [{'a': 2}] [{'a': 1}]"},
    {"{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('even')|list }} {{ "
     "[0,1,'',none,'x']|select|list }} {{ [1,2,3]|select('>', 1)|list }}",
     "[1, 3] [1, 3] [1, 'x'] [2, 3]"},
    {"{{ [{'n': 'a'}, {'n': 'b'}]|map(attribute='n')|join(',') }} {{ ['a','b']|map('upper')|list "
     "}} {{ [{'x': 1}, {}]|map(attribute='x', default=0)|list }} {{ [[1, "
     "2]]|map(attribute='1')|list }}",
     "a,b ['A', 'B'] [1, 0] [2]"},
    {"{{ {'b': 1, 'a': 2}|items|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ [1,2,3]|sum }} {{ "
     "[1,2,3]|max }} {{ [3,1]|min }} {{ [{'v': 2}, {'v': 5}]|sum(attribute='v') }}",
     "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)] 6 3 1 7"},
    {"{{ 'x'|string }} {{ 1|string }} {{ [1]|string }} {{ none|string }} {{ 'a<b>&\"\\''|escape }} "
     "{{ 'a<b'|safe }}",
     "x 1 [1] None a&lt;b&gt;&amp;&#34;&#39; a<b"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, "
     "blank=true) }}|{{ 'a\\nb\\n'|indent('> ') }}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b|a\n> b\n"},
    {"{{ '%s is %d years'|format('Bob', 42) }} {{ '%05.1f|%-4s|%x'|format(3.14159, 'ab', 255) }} "
     "{{ 'one two  three'|wordcount }}",
     "Bob is 42 years 003.1|ab  |ff 3"},
    {"{{ {'a': 'é', 'b': [1, 2.5, true, none], 'c': {'d': '\"\\\\\\n\\t\\u0001'}}|tojson }}",
     "{\"a\": \"é\", \"b\": [1, 2.5, true, null], \"c\": {\"d\": \"\\\"\\\\\\n\\t\\u0001\"}}"},
    {"{{ {'a': 1, 'b': [1, 2], 'c': {}}|tojson(indent=2) }}|{{ [1, []]|tojson(indent=2) }}|{{ "
     "{'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ "
     "[1,2]|tojson(separators=(',', ':')) }}",
     "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ],\n  \"c\": {}\n}|[\n  1,\n  []\n]|{\"a\": 2, "
     "\"b\": 1}|\"\\u00e9\"|[1,2]"},
    {"{{ 1.0|tojson }} {{ 1e100|tojson }} {{ 'x'|tojson|safe }} {{ 3|tojson }} {{ none|tojson }}",
     "1.0 1e+100 \"x\" 3 null"},
    {"{% filter upper %}abc {{ 'd' }}{% endfilter %}", "ABC D"},
    {"{{ [1, 2]|count }} {{ 'x'|attr('upper') is callable }}", "2 True"},
};

inline constexpr JinjaCase kTests[] = {
    {"{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is none }} {{ 'a' is string "
     "}} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }}",
     "False True True False True False True True True"},
    {"{{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is "
     "mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ x is iterable "
     "}}",
     "True False True True False True True False True"},
    {"{{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ true "
     "is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ "
     "0 is false }}",
     "True True True False True False True False True False"},
    {"{{ 2 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq "
     "1 }} {{ 1 is equalto(2) }} {{ 2 is in [1, 2] }} {{ 2 is gt 1 }} {{ 1 is lt 1 }} {{ 1 is ne 2 "
     "}}",
     "True True True False True False True True False True"},
    {"{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ 'x' is callable }} {{ x "
     "is not defined }} {{ 1 is not string }} {{ none is sameas none }}",
     "True True True False True True True"},
    {"{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }}", "True False True"},
};

inline constexpr JinjaCase kMethods[] = {
    {"{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', "
     "'h')) }} {{ 'hello'.startswith('l', 2) }}",
     "True True True True"},
    {"[{{ '  a b  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '\\n\\na\\n'.lstrip('\\n') }}] [{{ "
     "'a\\n\\n'.rstrip('\\n') }}] [{{ '  a '.lstrip() }}] [{{ ' a  '.rstrip() }}] [{{ "
     "'<>a<'.strip('<>') }}]",
     "[a b] [a] [a\n] [a] [a ] [ a] [a]"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ "
     "'a,b,c'.rsplit(',', 1) }} {{ 'a b c'.split(none, 1) }} {{ "
     "'x</think>y</think>z'.split('</think>')[-1] }}",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b c'] z"},
    {"{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ "
     "\"they're\".title() }} {{ 'hELLO'.capitalize() }} {{ 'aXa'.replace('a', 'b') }} {{ "
     "'aaa'.replace('a', 'b', 1) }}",
     "HELLO hello Hello World They'Re Hello bXb baa"},
    {"{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ "
     "'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ "
     "'{0}{0}{name}'.format('a', name='b') }}",
     "2 3 -1 2 a-b 1 and x aab"},
    {"{{ {'a': 1, 'b': 2}.keys()|list }} {{ {'a': 1}.values()|list }} {{ {'a': 1}.items()|list }} "
     "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z') }} {{ {'a': 1}.get('z', 9) }}",
     "['a', 'b'] [1] [('a', 1)] 1 None 9"},
    {"{{ '123'.isdigit() }} {{ 'a1'.isalnum() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ "
     "'a\\nb'.splitlines() }} {{ 'abc'.removeprefix('a') }}",
     "True True True True ['a', 'b'] bc"},
    {"{% set d = {'items': 5} %}{{ d['items'] }} {{ d.items is callable }}", "5 True"},
};

inline constexpr JinjaCase kMessages[] = {
    {"{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ "
     "messages[1].tool_calls[0].function.arguments|tojson }}{{ messages[0].missing is defined }}{{ "
     "messages[1].tool_calls[0].function is defined }}",
     "user:Hi;assistant:Yo;{\"a\": 1, \"b\": \"x\"}FalseTrue"},
    {"{{ messages|length }} {{ messages[-1].role }} {{ (messages|last).content }} {{ "
     "messages|map(attribute='role')|join('/') }} {{ messages|selectattr('role', 'equalto', "
     "'user')|list|length }}",
     "2 assistant Yo user/assistant 1"},
    {"{% for m in messages %}{% for tc in m.tool_calls %}{% for k, v in "
     "tc.function.arguments|items %}{{ k }}={{ v }} {% endfor %}{% endfor %}{% endfor %}",
     "a=1 b=x "},
};

}  // namespace moe::test_cases
