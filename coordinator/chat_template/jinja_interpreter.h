// Executes a parsed template: scopes (jinja2's rules: loop bodies and macros get their own scope,
// `if` does not), loops with the `loop` object, macros and call blocks, set/namespace, and the
// globals range(), namespace(), dict() and raise_exception(). All resource use is charged to a
// Budget so a hostile template fails instead of hanging.
#pragma once

#include <string>

#include "coordinator/chat_template/jinja_ast.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_value.h"

namespace moe::jinja {

// Checks that every filter and test the template names exists (jinja2 rejects unknown ones when
// compiling, even in branches that never run). Throws jinja::Error at the first unknown name.
void validate(const Body& program);

// Renders `program` with `variables` as the template's context. Throws jinja::Error.
std::string render(const Body& program, const Dict& variables, const Limits& limits);

}  // namespace moe::jinja
