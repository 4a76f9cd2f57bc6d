// The assets by path.
#include "web/assets.h"

namespace hr::web {

// Written at build time (embed_asset.cmake), one source each.
std::string_view dashboard_html();
std::string_view dashboard_js();
std::string_view dashboard_css();
std::string_view uplot_js();
std::string_view uplot_css();
std::string_view docs_html();
std::string_view docs_js();
std::string_view swagger_js();
std::string_view swagger_css();

namespace {

constexpr std::string_view kHtml = "text/html; charset=utf-8";
constexpr std::string_view kJs = "text/javascript; charset=utf-8";
constexpr std::string_view kCss = "text/css; charset=utf-8";

struct Entry {
  std::string_view path;
  std::string_view (*body)();
  std::string_view content_type;
};

constexpr Entry kAssets[] = {
    {"/dashboard", dashboard_html, kHtml},
    {"/dashboard/", dashboard_html, kHtml},
    {"/dashboard/app.js", dashboard_js, kJs},
    {"/dashboard/app.css", dashboard_css, kCss},
    {"/dashboard/uplot.js", uplot_js, kJs},
    {"/dashboard/uplot.css", uplot_css, kCss},
    {"/docs", docs_html, kHtml},
    {"/docs/", docs_html, kHtml},
    {"/docs/docs.js", docs_js, kJs},
    {"/docs/swagger-ui-bundle.js", swagger_js, kJs},
    {"/docs/swagger-ui.css", swagger_css, kCss},
};

bool under(std::string_view path, std::string_view page) {
  return path == page || (path.size() > page.size() && path.substr(0, page.size()) == page &&
                          path[page.size()] == '/');
}

}  // namespace

bool is_page_path(std::string_view path) {
  return under(path, "/dashboard") || under(path, "/docs");
}

std::optional<Asset> find_asset(std::string_view path) {
  for (const Entry& e : kAssets) {
    if (e.path == path) return Asset{e.body(), e.content_type};
  }
  return std::nullopt;
}

std::string_view content_security_policy() {
  return "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
         "connect-src 'self'; frame-ancestors 'none'";
}

}  // namespace hr::web
