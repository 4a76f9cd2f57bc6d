// Chat templates.
#include "engine/jinja/template.h"

#include "engine/jinja/interpreter.h"
#include "engine/jinja/lexer.h"
#include "engine/jinja/parser.h"

namespace hr::engine::jinja {

Result<Template> Template::parse(std::string_view source) {
  HR_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  HR_ASSIGN_OR_RETURN(std::vector<NodePtr> program, jinja::parse(tokens));
  Template t;
  t.program_ = std::make_shared<const std::vector<NodePtr>>(std::move(program));
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return invalid_argument("the template's context must be an object");
  Env globals;
  add_globals(globals);
  for (const auto& [key, value] : context.items()) globals.set(key, Value::from_json(value));
  try {
    return render_program(*program_, globals);
  } catch (const Error& e) {
    return invalid_argument("chat template line " + std::to_string(e.line()) + ": " + e.what(),
                            "messages");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what(), "messages");
  }
}

}  // namespace hr::engine::jinja
