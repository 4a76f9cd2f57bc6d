# Writes OUT: a C++ file that returns the listed migration files' contents (cmake -P script).
# Inputs: MIGRATIONS_DIR, FILES (comma-separated names), OUT.
string(REPLACE "," ";" FILES "${FILES}")
set(body "")
foreach(name ${FILES})
  file(READ "${MIGRATIONS_DIR}/${name}" sql)
  string(APPEND body "    {\"${name}\", R\"hr_sql(${sql})hr_sql\"},\n")
endforeach()
file(WRITE "${OUT}.tmp" "// Generated from migrations/ at build time.\n#include \"queue/migrate.h\"\n\n#include <utility>\n\nnamespace hr::queue {\n\nconst std::vector<Migration>& bundled_migrations() {\n  static const std::vector<Migration> kAll = [] {\n    std::vector<std::pair<std::string, std::string>> files = {\n${body}    };\n    std::vector<Migration> out;\n    for (auto& [name, sql] : files) out.push_back(make_migration(name, std::move(sql)).value());\n    return out;\n  }();\n  return kAll;\n}\n\n}  // namespace hr::queue\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
