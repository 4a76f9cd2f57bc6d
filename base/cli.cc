// Environment names and the config-file layer for CLI11 options.
#include "base/cli.h"

#include <fstream>
#include <sstream>

namespace hr::cli {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// Returns the option named `--key` in `app` or its parsed subcommands, or nullptr.
CLI::Option* find_in_parsed(CLI::App& app, const std::string& key) {
  if (CLI::Option* o = app.get_option_no_throw("--" + key)) return o;
  for (CLI::App* sub : app.get_subcommands()) {
    if (CLI::Option* o = find_in_parsed(*sub, key)) return o;
  }
  return nullptr;
}

bool exists_anywhere(CLI::App& app, const std::string& key) {
  if (app.get_option_no_throw("--" + key)) return true;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (exists_anywhere(*sub, key)) return true;
  }
  return false;
}

Status set_if_unset(CLI::Option* opt, const std::string& key, const std::string& value) {
  if (opt->count() > 0) return Status::ok();
  try {
    opt->add_result(value);
    opt->run_callback();
  } catch (const CLI::Error& e) {
    return invalid_argument("config file: bad value for '" + key + "': " + e.what(), key);
  }
  return Status::ok();
}

}  // namespace

std::string env_name(std::string_view flag) {
  while (!flag.empty() && flag.front() == '-') flag.remove_prefix(1);
  std::string out = "HEADROOM_";
  for (char c : flag) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

Result<ConfigFile> parse_config_text(std::string_view text) {
  ConfigFile file;
  std::string section;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return invalid_argument("config file line " + std::to_string(line_no) +
                                ": unterminated section header");
      }
      section = std::string(trim(line.substr(1, line.size() - 2)));
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return invalid_argument("config file line " + std::to_string(line_no) +
                              ": expected key = value");
    }
    std::string key(trim(line.substr(0, eq)));
    std::string_view value = trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    for (char& c : key) {
      if (c == '_') c = '-';
    }
    if (key.empty()) {
      return invalid_argument("config file line " + std::to_string(line_no) + ": empty key");
    }
    file.sections[section][key] = std::string(value);
  }
  return file;
}

Result<ConfigFile> read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read config file " + path, "config");
  std::stringstream ss;
  ss << in.rdbuf();
  Result<ConfigFile> r = parse_config_text(ss.str());
  if (!r.is_ok()) return r.status().with_context(path);
  return r;
}

Status apply_config_file(CLI::App& root, const ConfigFile& file) {
  for (const auto& [section, values] : file.sections) {
    CLI::App* scope = &root;
    if (!section.empty()) {
      try {
        scope = root.get_subcommand(section);
      } catch (const CLI::Error&) {
        return invalid_argument("config file: unknown section [" + section + "]", section);
      }
      if (!scope->parsed()) continue;
    }
    for (const auto& [key, value] : values) {
      CLI::Option* opt =
          section.empty() ? find_in_parsed(root, key) : scope->get_option_no_throw("--" + key);
      if (opt == nullptr) {
        bool known = section.empty() ? exists_anywhere(root, key) : false;
        if (known) continue;  // belongs to a subcommand that is not running
        return invalid_argument("config file: unknown option '" + key + "'", key);
      }
      HR_RETURN_IF_ERROR(set_if_unset(opt, key, value));
    }
  }
  return Status::ok();
}

}  // namespace hr::cli
