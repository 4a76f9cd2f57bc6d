// The pages served beside the API, compiled into the binary: the dashboard (/dashboard) and the
// API reference (/docs), with their scripts, styles and the browser libraries they use. Served
// without a key (the pages sign in with one kept in the browser) and with a content security
// policy that lets them reach only their own origin.
#pragma once

#include <optional>
#include <string_view>

namespace hr::web {

struct Asset {
  std::string_view body;
  std::string_view content_type;
};

// Whether `path` is under one of the pages (/dashboard, /dashboard/..., /docs, /docs/...).
bool is_page_path(std::string_view path);

// The asset served at `path`; none when there is no such asset.
std::optional<Asset> find_asset(std::string_view path);

// The Content-Security-Policy the pages are served with.
std::string_view content_security_policy();

}  // namespace hr::web
