// Recursive-descent parser from tokens to the syntax tree, following jinja2's grammar and
// operator precedence (filters and tests bind tighter than arithmetic; `-x|f` is f(-x)).
#pragma once

#include <vector>

#include "coordinator/chat_template/jinja_ast.h"
#include "coordinator/chat_template/jinja_lexer.h"

namespace moe::jinja {

// Throws jinja::Error (with the offending token's position) on syntax errors, unknown or
// unsupported tags, and nesting deeper than max_nesting.
Body parse(std::vector<Token> tokens, size_t max_nesting);

}  // namespace moe::jinja
