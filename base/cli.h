// Command-line, environment and config-file options, in that order of precedence.
// Every option added with hr::cli::add also reads HEADROOM_<NAME> (e.g. --database-url →
// HEADROOM_DATABASE_URL); after parsing, apply_config_file() fills the options still unset from a
// `key = value` file (with optional [subcommand] sections). Not thread-safe: used once, in main.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr::cli {

// "--database-url" → "HEADROOM_DATABASE_URL".
std::string env_name(std::string_view flag);

template <typename T>
CLI::Option* add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  CLI::Option* opt = app.add_option(flag, value, help)->capture_default_str();
  opt->envname(env_name(flag));
  return opt;
}

inline CLI::Option* add_flag(CLI::App& app, const std::string& flag, bool& value,
                             const std::string& help) {
  CLI::Option* opt = app.add_flag(flag, value, help);
  opt->envname(env_name(flag));
  return opt;
}

struct ConfigFile {
  // Section ("" for top level) → key → value.
  std::map<std::string, std::map<std::string, std::string>> sections;
};

// Parses `key = value` lines, `# comments`, `[section]` headers and optionally quoted values.
[[nodiscard]] Result<ConfigFile> parse_config_text(std::string_view text);
[[nodiscard]] Result<ConfigFile> read_config_file(const std::string& path);

// For each key, sets the matching option of `root` (top-level keys: the root or any parsed
// subcommand; [name] keys: that subcommand) unless the command line or environment already set
// it. A key that names no option is an error naming the key.
[[nodiscard]] Status apply_config_file(CLI::App& root, const ConfigFile& file);

}  // namespace hr::cli
