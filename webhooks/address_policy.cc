// Address classification for outbound calls.
#include "webhooks/address_policy.h"

#include "base/cli.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

namespace hr::webhooks {
namespace {

struct Range {
  const char* cidr;
  const char* name;
};

// IPv4 ranges that are not the public internet (RFC 6890 and friends).
constexpr Range kV4Forbidden[] = {
    {"0.0.0.0/8", "unspecified"},
    {"10.0.0.0/8", "private"},
    {"100.64.0.0/10", "shared (CGNAT)"},
    {"127.0.0.0/8", "loopback"},
    {"169.254.0.0/16", "link-local (cloud metadata)"},
    {"172.16.0.0/12", "private"},
    {"192.0.0.0/24", "IETF protocol"},
    {"192.0.2.0/24", "documentation"},
    {"192.88.99.0/24", "6to4 relay"},
    {"192.168.0.0/16", "private"},
    {"198.18.0.0/15", "benchmarking"},
    {"198.51.100.0/24", "documentation"},
    {"203.0.113.0/24", "documentation"},
    {"224.0.0.0/4", "multicast"},
    {"240.0.0.0/4", "reserved"},
};
constexpr Range kV6Forbidden[] = {
    {"::/128", "unspecified"},
    {"::1/128", "loopback"},
    {"::/96", "IPv4-compatible"},
    {"100::/64", "discard"},
    {"2001:db8::/32", "documentation"},
    {"fc00::/7", "unique local (private)"},
    {"fe80::/10", "link-local"},
    {"fec0::/10", "site-local"},
    {"ff00::/8", "multicast"},
    // Forms that reach IPv4 hosts through a translator or tunnel this policy cannot see through:
    // local-use NAT64 (RFC 8215), Teredo (an IPv4 server and an obfuscated IPv4 client inside) and
    // IPv4-translated addresses (::ffff:0:a.b.c.d, RFC 2765).
    {"64:ff9b:1::/48", "NAT64 (local use)"},
    {"2001::/32", "Teredo"},
    {"::ffff:0:0:0/96", "IPv4-translated"},
};

const std::vector<std::pair<Cidr, std::string>>& forbidden_table() {
  static const std::vector<std::pair<Cidr, std::string>> table = [] {
    std::vector<std::pair<Cidr, std::string>> t;
    for (const Range& r : kV4Forbidden) t.emplace_back(parse_cidr(r.cidr).value(), r.name);
    for (const Range& r : kV6Forbidden) t.emplace_back(parse_cidr(r.cidr).value(), r.name);
    return t;
  }();
  return table;
}

// The IPv4 address an IPv6 one carries, for the forms that route to it: mapped (::ffff:0:0/96),
// NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
std::optional<IpAddress> embedded_v4(const IpAddress& a) {
  if (!a.v6) return std::nullopt;
  const auto& b = a.bytes;
  IpAddress v4;
  bool mapped = std::all_of(b.begin(), b.begin() + 10, [](uint8_t x) { return x == 0; }) &&
                b[10] == 0xff && b[11] == 0xff;
  static const uint8_t kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (mapped || std::memcmp(b.data(), kNat64, 12) == 0) {
    std::copy(b.begin() + 12, b.end(), v4.bytes.begin());
    return v4;
  }
  if (b[0] == 0x20 && b[1] == 0x02) {
    std::copy(b.begin() + 2, b.begin() + 6, v4.bytes.begin());
    return v4;
  }
  return std::nullopt;
}

}  // namespace

std::string IpAddress::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof(buf));
  return buf;
}

Result<IpAddress> parse_ip(std::string_view text) {
  std::string s(text);
  IpAddress a;
  if (inet_pton(AF_INET, s.c_str(), a.bytes.data()) == 1) return a;
  a.v6 = true;
  if (inet_pton(AF_INET6, s.c_str(), a.bytes.data()) == 1) return a;
  return invalid_argument("not an IP address: " + s);
}

bool Cidr::contains(const IpAddress& a) const {
  if (a.v6 != base.v6) return false;
  int full = prefix / 8;
  if (std::memcmp(a.bytes.data(), base.bytes.data(), static_cast<size_t>(full)) != 0) return false;
  int rest = prefix % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a.bytes[static_cast<size_t>(full)] & mask) ==
         (base.bytes[static_cast<size_t>(full)] & mask);
}

Result<Cidr> parse_cidr(std::string_view text) {
  size_t slash = text.find('/');
  Cidr c;
  HR_ASSIGN_OR_RETURN(c.base, parse_ip(text.substr(0, slash)));
  int max = c.base.v6 ? 128 : 32;
  c.prefix = max;
  if (slash != std::string_view::npos) {
    std::string p(text.substr(slash + 1));
    if (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(p) > max) {
      return invalid_argument("bad prefix length in " + std::string(text));
    }
    c.prefix = std::stoi(p);
  }
  return c;
}

std::optional<std::string> forbidden_range(const IpAddress& a) {
  if (auto v4 = embedded_v4(a)) {
    if (auto inner = forbidden_range(*v4)) return *inner + " (embedded in IPv6)";
    return std::nullopt;
  }
  for (const auto& [cidr, name] : forbidden_table()) {
    if (cidr.contains(a)) return name;
  }
  return std::nullopt;
}

Result<AddressPolicy> AddressPolicy::parse(const std::vector<std::string>& allow) {
  AddressPolicy p;
  for (const std::string& entry : allow) {
    if (entry.empty()) continue;
    if (entry == "loopback") {
      p.allow_.push_back(parse_cidr("127.0.0.0/8").value());
      p.allow_.push_back(parse_cidr("::1/128").value());
      continue;
    }
    if (entry == "private") {
      p.allow_all_ = true;
      continue;
    }
    Result<Cidr> c = parse_cidr(entry);
    if (!c.is_ok()) {
      return invalid_argument(
          "webhook allow-list entries are CIDRs, 'loopback' or 'private': " + entry,
          "webhook-allow");
    }
    p.allow_.push_back(*c);
  }
  return p;
}

bool AddressPolicy::allows_loopback() const {
  return allow_all_ || std::any_of(allow_.begin(), allow_.end(), [](const Cidr& c) {
           return c.contains(parse_ip("127.0.0.1").value());
         });
}

Status AddressPolicy::check(const IpAddress& a, std::string_view host,
                            std::string_view field) const {
  std::optional<std::string> range = forbidden_range(a);
  if (!range || allow_all_) return Status::ok();
  IpAddress plain = embedded_v4(a).value_or(a);
  for (const Cidr& c : allow_) {
    if (c.contains(a) || c.contains(plain)) return Status::ok();
  }
  std::string where =
      host == a.to_string() ? a.to_string() : std::string(host) + " (" + a.to_string() + ")";
  return invalid_argument(std::string(field) + " points at " + where + ", a " + *range +
                              " address; only public addresses may receive webhooks",
                          std::string(field));
}

namespace {

// The system resolver's addresses for `host`, without duplicates.
Result<std::vector<IpAddress>> system_lookup(const std::string& host, const std::string& field) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return Status(StatusCode::kUnavailable,
                  field + " host " + host + " does not resolve: " + gai_strerror(rc), field);
  }
  std::vector<IpAddress> out;
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    IpAddress a;
    if (p->ai_family == AF_INET) {
      std::memcpy(a.bytes.data(), &reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr, 4);
    } else if (p->ai_family == AF_INET6) {
      a.v6 = true;
      std::memcpy(a.bytes.data(), &reinterpret_cast<sockaddr_in6*>(p->ai_addr)->sin6_addr, 16);
    } else {
      continue;
    }
    bool dup = false;
    for (const IpAddress& seen : out) dup = dup || (seen.v6 == a.v6 && seen.bytes == a.bytes);
    if (!dup) out.push_back(a);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace

Result<std::vector<IpAddress>> lookup_within(const std::string& host, std::string_view field,
                                             std::chrono::milliseconds timeout, HostLookup lookup) {
  using Answer = Result<std::vector<IpAddress>>;
  auto answer = std::make_shared<std::promise<Answer>>();
  std::future<Answer> future = answer->get_future();
  std::thread([answer, host, lookup = std::move(lookup)] {
    answer->set_value(lookup(host));
  }).detach();
  if (future.wait_for(timeout) != std::future_status::ready) {
    return Status(StatusCode::kUnavailable,
                  std::string(field) + " host " + host + " did not resolve within " +
                      std::to_string(timeout.count()) + " ms",
                  std::string(field));
  }
  return future.get();
}

Result<std::vector<IpAddress>> resolve_checked(const std::string& host, const AddressPolicy& policy,
                                               std::string_view field,
                                               std::chrono::milliseconds timeout, uint16_t port) {
  if (host.empty())
    return invalid_argument(std::string(field) + " has no host", std::string(field));
  const std::string name(field);
  HR_ASSIGN_OR_RETURN(
      std::vector<IpAddress> out,
      lookup_within(host, field, timeout,
                    policy.lookup() ? policy.lookup() : HostLookup([name](const std::string& h) {
                      return system_lookup(h, name);
                    })));
  if (out.empty()) {
    return invalid_argument(std::string(field) + " host " + host + " has no addresses",
                            std::string(field));
  }
  for (const IpAddress& a : out) {
    HR_RETURN_IF_ERROR(policy.check(a, host, field));
    if (port != 0) HR_RETURN_IF_ERROR(policy.check_port(a, port, field));
  }
  return out;
}

void AddressPolicy::refuse_service(const std::string& host, uint16_t port) {
  if (port == 0) return;
  Result<IpAddress> ip = parse_ip(host);
  const std::optional<std::string> range = ip.is_ok() ? forbidden_range(*ip) : std::nullopt;
  // The machine itself: a local name, a loopback or unspecified address, a Unix socket's folder.
  // Every address that reaches it locally is refused at that port (0.0.0.0 and :: connect to
  // the machine too).
  if (host.empty() || host.front() == '/' || host == "localhost" || host.ends_with(".localhost") ||
      range == std::optional<std::string>("loopback") ||
      range == std::optional<std::string>("unspecified")) {
    for (const char* local : {"127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"}) {
      services_.emplace_back(parse_cidr(local).value(), port);
    }
    return;
  }
  if (ip.is_ok()) {
    services_.emplace_back(Cidr{*ip, ip->v6 ? 128 : 32}, port);
    return;
  }
  Result<std::vector<IpAddress>> addrs = system_lookup(host, "service");
  if (!addrs.is_ok()) return;
  for (const IpAddress& a : *addrs) services_.emplace_back(Cidr{a, a.v6 ? 128 : 32}, port);
}

void AddressPolicy::refuse_services(const std::vector<std::string>& endpoints) {
  for (const std::string& e : endpoints) {
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos) continue;
    std::string host = e.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    int port = 0;
    try {
      port = std::stoi(e.substr(colon + 1));
    } catch (...) {
      continue;
    }
    if (port > 0 && port < 65536) refuse_service(host, static_cast<uint16_t>(port));
  }
}

Status AddressPolicy::check_port(const IpAddress& a, uint16_t port, std::string_view field) const {
  const IpAddress plain = embedded_v4(a).value_or(a);
  for (const auto& [cidr, p] : services_) {
    if (p == port && (cidr.contains(a) || cidr.contains(plain))) {
      return invalid_argument(std::string(field) + " points at a port this service itself " +
                                  "listens on; webhooks cannot target it",
                              std::string(field));
    }
  }
  return Status::ok();
}

void bind_webhook_allow(CLI::App& app, std::vector<std::string>& allow) {
  cli::add(app, "--webhook-allow", allow,
           "Non-public webhook targets to allow anyway: CIDRs, 'loopback' or 'private' "
           "(repeatable or comma-separated)")
      ->delimiter(',');
}

}  // namespace hr::webhooks
