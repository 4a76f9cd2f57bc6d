// Which addresses an outbound call to a user-given URL (a webhook) may reach. Resolves a host and
// refuses loopback, private, link-local (cloud metadata), shared, multicast, reserved and
// documentation ranges, IPv4 and IPv6 (including IPv4 embedded in IPv6: mapped, NAT64, 6to4),
// unless an allow-list names them. Callers connect to exactly the addresses checked here rather
// than resolving again, so a DNS answer that changes between check and connect (rebinding) cannot
// slip through. Thread-safe.
#pragma once

#include <CLI/CLI.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace hr::webhooks {

struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // IPv4 in bytes[0..3]
  std::string to_string() const;
};

[[nodiscard]] Result<IpAddress> parse_ip(std::string_view text);

struct Cidr {
  IpAddress base;
  int prefix = 0;
  bool contains(const IpAddress& a) const;
};

// "10.0.0.0/8", "::1/128" or a bare address (a /32 or /128).
[[nodiscard]] Result<Cidr> parse_cidr(std::string_view text);

// Why `a` must not be reached from a user-given URL ("loopback", "private", ...), or nullopt when
// it is a public address.
std::optional<std::string> forbidden_range(const IpAddress& a);

// Looks a host name up: its addresses, or kUnavailable.
using HostLookup = std::function<Result<std::vector<IpAddress>>(const std::string& host)>;

class AddressPolicy {
 public:
  // Entries are CIDRs or the words "loopback" (127.0.0.0/8, ::1) and "private" (every range
  // forbidden_range() names). An empty list allows public addresses only.
  [[nodiscard]] static Result<AddressPolicy> parse(const std::vector<std::string>& allow);

  // OK when `a` is public or allowed; kInvalidArgument naming `field` otherwise.
  [[nodiscard]] Status check(const IpAddress& a, std::string_view host,
                             std::string_view field) const;
  bool allows_loopback() const;
  const std::vector<Cidr>& allowed() const { return allow_; }

  // The product's own services (its API and worker ports, Postgres, Redis), never targets
  // whatever the allow-list says: `host` as the service is reached or bound ("127.0.0.1",
  // "localhost", "0.0.0.0", "db.internal"), with its port. A loopback, unspecified or local name
  // refuses the port on every loopback address; another name is resolved now (best effort).
  void refuse_service(const std::string& host, uint16_t port);
  // The same for each "host:port" ("[::1]:5432" for IPv6); entries that do not parse are skipped.
  void refuse_services(const std::vector<std::string>& endpoints);
  // kInvalidArgument naming `field` when `a`:`port` is one of the refused services.
  [[nodiscard]] Status check_port(const IpAddress& a, uint16_t port, std::string_view field) const;
  // How resolve_checked() looks names up under this policy (null: the system resolver).
  void set_lookup(HostLookup lookup) { lookup_ = std::move(lookup); }
  const HostLookup& lookup() const { return lookup_; }

 private:
  std::vector<Cidr> allow_;
  bool allow_all_ = false;
  std::vector<std::pair<Cidr, uint16_t>> services_;
  HostLookup lookup_;
};

// Resolves `host` (a name or an address literal) and checks every address, and with a `port`
// every address at that port against the refused services; any forbidden one refuses the whole
// host. kInvalidArgument naming `field` when refused; kUnavailable when the name does not
// resolve, or not within `timeout` (which may pass).
[[nodiscard]] Result<std::vector<IpAddress>> resolve_checked(
    const std::string& host, const AddressPolicy& policy, std::string_view field,
    std::chrono::milliseconds timeout = std::chrono::seconds(5), uint16_t port = 0);

// What `lookup(host)` answers if it answers within `timeout`; else kUnavailable naming `field`,
// and the lookup (the system resolver may hang for tens of seconds) finishes on its own thread,
// its answer dropped. resolve_checked's deadline, for any lookup.
[[nodiscard]] Result<std::vector<IpAddress>> lookup_within(const std::string& host,
                                                           std::string_view field,
                                                           std::chrono::milliseconds timeout,
                                                           HostLookup lookup);

// Registers --webhook-allow (CIDRs, "loopback", "private") on a subcommand.
void bind_webhook_allow(CLI::App& app, std::vector<std::string>& allow);

}  // namespace hr::webhooks
