// The Jinja interpreter on its own: whitespace control, scopes, loops, macros, namespaces,
// filters and tests as chat templates use them, and errors that name the template line.
#include "engine/jinja/template.h"

#include <gtest/gtest.h>

namespace hr::engine::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& source, const ojson& context = ojson::object()) {
  Result<Template> t = Template::parse(source);
  if (!t.is_ok()) return "PARSE ERROR: " + t.status().message();
  Result<std::string> r = t->render(context);
  return r.is_ok() ? *r : "RENDER ERROR: " + r.status().message();
}

TEST(JinjaTest, WhitespaceControlAsHuggingFaceConfiguresIt) {
  // trim_blocks and lstrip_blocks, `-` on either side, the trailing newline dropped.
  EXPECT_EQ(render("{% if true %}\n  a\n{% endif %}\n"), "  a\n");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %}"), "xy");
  EXPECT_EQ(render("  {% if true %}a{% endif %}"), "a");
  EXPECT_EQ(render("a {{- 'b' -}} c"), "abc");
  EXPECT_EQ(render("a{# comment #}b"), "ab");
  EXPECT_EQ(render("a {#- comment -#} b"), "ab");
  EXPECT_EQ(render("{% generation %}x{% endgeneration %}"), "x");
}

TEST(JinjaTest, ValuesPrintAsTheReferencePrintsThem) {
  EXPECT_EQ(render("{{ true }} {{ none }}|{{ 1.0 }} {{ 2.5 }} {{ 7 // 2 }} {{ -7 % 3 }}"),
            "true |1.0 2.5 3 -1");
  EXPECT_EQ(render("{{ [1, 'a', none] }} {{ {'k': [true]} }}"), "[1, \"a\", null] {\"k\": [true]}");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ 2.0 }}"), "a12");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", {{"x", {{"b", 1}, {"a", {1, 2}}}}}),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ 'é\"\\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}"),
            "\"é\\\"\\n\" \"\\u00e9\"");
}

TEST(JinjaTest, LoopsScopesAndNamespaces) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}"
                   "{% endfor %}",
                   {{"xs", {"a", "b", "c"}}}),
            "1a,2b,3c");
  // A set inside a loop stays in the loop; a namespace carries it out.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}"
                   "{% set n = n + x %}{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 6");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% else %}none{% endfor %}"),
            "24");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  // As in the reference, an iteration that breaks or continues loses what it printed before.
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
                   "{% if x == 3 %}{% break %}{% endif %}{% endfor %}"),
            "1");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
                   "{% endfor %}"),
            "13");
}

TEST(JinjaTest, MacrosWithDefaultsKeywordsAndCallBlocks) {
  EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=2) }}"),
            "1B 12");
  EXPECT_EQ(render("{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}in{% endcall %}"),
            "[in]");
  EXPECT_EQ(render("{% macro m(a) %}{{ kwargs.x }}{{ varargs | length }}{% endmacro %}"
                   "{{ m(1, 2, 3, x='k') }}"),
            "k2");
}

TEST(JinjaTest, FiltersTestsAndMethodsTemplatesUse) {
  const ojson msgs = {{{"role", "user"}, {"content", " hi "}},
                      {{"role", "tool"}, {"content", "x"}},
                      {{"role", "user"}, {"content", "yo"}}};
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content')"
                   " | join('|') }}",
                   {{"messages", msgs}}),
            " hi |yo");
  EXPECT_EQ(
      render("{{ messages[0].content | trim }}{{ messages | length }}{{ messages[-1]['role'] }}",
             {{"messages", msgs}}),
      "hi3user");
  EXPECT_EQ(render("{{ 'a,b,c'.split(',') }} {{ 'Hello'.startswith('He') }} {{ ' x '.strip() }}"),
            "[\"a\", \"b\", \"c\"] true x");
  EXPECT_EQ(render("{{ 'abc'[1:] }} {{ [1, 2, 3][::-1] }} {{ 'hello world' | title }}"),
            "bc [3, 2, 1] Hello World");
  EXPECT_EQ(render("{{ x is defined }} {{ y is none }} {{ 'a' is string }} {{ d is mapping }}",
                   {{"y", nullptr}, {"d", ojson::object()}}),
            "false true true true");
  EXPECT_EQ(
      render("{{ d.get('k', 'dflt') }} {{ u | default('D') }} {{ 'k' in d }}", {{"d", {{"z", 1}}}}),
      "dflt D false");
  EXPECT_EQ(render("{{ 'x' if false }}|{{ 'a' if true else 'b' }}"), "|a");
}

TEST(JinjaTest, ErrorsNameTheTemplateLine) {
  EXPECT_EQ(
      render("line one\n{% if x %}\n{{ raise_exception('roles must alternate') }}\n{% endif %}",
             {{"x", true}}),
      "RENDER ERROR: chat template line 3: roles must alternate");
  EXPECT_EQ(render("a\nb\n{% for %}"), "PARSE ERROR: chat template line 3: unexpected %}");
  EXPECT_EQ(render("a\n{{ 'unclosed }}"),
            "PARSE ERROR: chat template line 2: a string is not closed");
  EXPECT_EQ(render("{{ 1 + none }}"), "RENDER ERROR: chat template line 1: cannot apply + to none");
}

// A template that recurses or loops without end is an error naming its line, not a crash or a
// hung worker (found by jinja_fuzz: a macro calling itself overflowed the stack, range(10**8)
// ran out of memory, 200 nested parentheses overflowed the parser's stack).
TEST(JinjaTest, RunawayTemplatesAreBoundedErrors) {
  const std::string recursion = render("{% macro f(n) %}{{ f(n) }}{% endmacro %}\n{{ f(1) }}");
  EXPECT_NE(recursion.find("the template nests calls more than 200 deep"), std::string::npos)
      << recursion;
  EXPECT_NE(recursion.find("line 1"), std::string::npos) << recursion;
  EXPECT_EQ(render("{% for i in range(100000000) %}x{% endfor %}"),
            "RENDER ERROR: chat template line 1: range() of more than 1000000 numbers");
  EXPECT_EQ(render("{% for i in range(9223372036854775800, 9223372036854775807, 5) %}"
                   "{{ i }} {% endfor %}"),
            "9223372036854775800 9223372036854775805 ");
  const std::string loops =
      render("{% for x in range(1000) %}{% for y in range(1000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(loops.find("the template ran more than 1000000 steps"), std::string::npos) << loops;
  const std::string parens =
      render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}");
  EXPECT_EQ(parens, "PARSE ERROR: chat template line 1: the template nests more than 200 deep")
      << parens;
  const std::string nots = render("{{ " + [] {
    std::string s;
    for (int i = 0; i < 300; ++i) s += "not ";
    return s;
  }() + "true }}");
  EXPECT_EQ(nots, "PARSE ERROR: chat template line 1: the template nests more than 200 deep")
      << nots;
  // Integer arithmetic with no integer answer gives a float, as the reference's JavaScript does
  // (found by jinja_fuzz: range(1 % 0) cast NaN to an integer).
  EXPECT_EQ(render("{{ (1 % 0) is number }} {{ 1 // 0 > 1000 }} {{ 7 % 3 }}"), "true true 1");
  EXPECT_EQ(render("{% for x in range(1 % 0) %}x{% endfor %}"),
            "RENDER ERROR: chat template line 1: range() arguments must be integers");
  // A namespace cannot hold itself (it would never be freed; found by jinja_fuzz), directly or
  // through a list or another namespace; other values still go in.
  EXPECT_EQ(render("{% set ns = namespace(a=0) %}{% set ns.a = ns %}"),
            "RENDER ERROR: chat template line 1: cannot store a namespace inside itself");
  EXPECT_EQ(render("{% set ns = namespace(a=0) %}{% set other = namespace(b=[ns]) %}"
                   "{% set ns.a = [1, other] %}"),
            "RENDER ERROR: chat template line 1: cannot store a namespace inside itself");
  EXPECT_EQ(render("{% set ns = namespace(a=0) %}{% set other = namespace(b=1) %}"
                   "{% set ns.a = [other, other] %}{{ ns.a[1].b }}"),
            "1");
  // What real templates do stays well inside: 30 nested calls, 50,000 loop turns.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}ok{% endif %}"
                   "{% endmacro %}{{ f(30) }}"),
            "ok");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(50000) %}"
                   "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"),
            "50000");
}

}  // namespace
}  // namespace hr::engine::jinja
