// Thompson construction and distances to the accept node.
#include "grammar/nfa.h"

#include <deque>

namespace hr::grammar {

int32_t Nfa::add_node() {
  if (nodes_.size() >= max_nodes_) {
    overflowed_ = true;
    // Keep building into one scratch node so that callers need no checks; finish() fails.
    if (nodes_.size() == max_nodes_) nodes_.emplace_back();
    return static_cast<int32_t>(max_nodes_);
  }
  nodes_.emplace_back();
  return static_cast<int32_t>(nodes_.size() - 1);
}

void Nfa::add_bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
  if (overflowed_) return;
  nodes_[static_cast<size_t>(from)].bytes.push_back({lo, hi, to});
}

void Nfa::add_eps(int32_t from, int32_t to) {
  if (overflowed_) return;
  nodes_[static_cast<size_t>(from)].eps.push_back(to);
}

Frag Nfa::empty() {
  int32_t n = add_node();
  return {n, n};
}

Frag Nfa::literal(std::string_view bytes) {
  Frag f = empty();
  for (char c : bytes) {
    int32_t next = add_node();
    add_bytes(f.out, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
    f.out = next;
  }
  return f;
}

Frag Nfa::byte_range(uint8_t lo, uint8_t hi) {
  Frag f{add_node(), add_node()};
  add_bytes(f.in, lo, hi, f.out);
  return f;
}

Frag Nfa::seq(Frag a, Frag b) {
  add_eps(a.out, b.in);
  return {a.in, b.out};
}

Frag Nfa::alt(const std::vector<Frag>& options) {
  Frag f{add_node(), add_node()};
  for (const Frag& o : options) {
    add_eps(f.in, o.in);
    add_eps(o.out, f.out);
  }
  return f;
}

Frag Nfa::opt(Frag a) {
  Frag f{add_node(), add_node()};
  add_eps(f.in, a.in);
  add_eps(a.out, f.out);
  add_eps(f.in, f.out);
  return f;
}

Frag Nfa::star(Frag a) {
  Frag f{add_node(), add_node()};
  add_eps(f.in, a.in);
  add_eps(a.out, a.in);
  add_eps(a.out, f.out);
  add_eps(f.in, f.out);
  return f;
}

Frag Nfa::code_points(uint32_t lo, uint32_t hi) {
  Frag f{add_node(), add_node()};
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  // Surrogates are not characters.
  if (lo <= 0xD7FF) add_utf8_range(f.in, f.out, lo, std::min<uint32_t>(hi, 0xD7FF));
  if (hi >= 0xE000) add_utf8_range(f.in, f.out, std::max<uint32_t>(lo, 0xE000), hi);
  return f;
}

// Code points [lo, hi] of one UTF-8 length class each time: split until every byte position is a
// plain range (the usual split by the boundaries of the continuation bytes).
void Nfa::add_utf8_range(int32_t from, int32_t to, uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int n = 0; n < 3; ++n) {
    if (lo <= kMax[n] && hi > kMax[n]) {
      add_utf8_range(from, to, lo, kMax[n]);
      add_utf8_range(from, to, kMax[n] + 1, hi);
      return;
    }
  }
  if (hi <= 0x7F) {
    add_bytes(from, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to);
    return;
  }
  const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  // Split so that all but the first byte cover whole continuation ranges or one value.
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        add_utf8_range(from, to, lo, lo | m);
        add_utf8_range(from, to, (lo | m) + 1, hi);
        return;
      }
      if ((hi & m) != m) {
        add_utf8_range(from, to, lo, (hi & ~m) - 1);
        add_utf8_range(from, to, hi & ~m, hi);
        return;
      }
    }
  }
  auto encode = [&](uint32_t cp, uint8_t* out) {
    if (len == 2) {
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else if (len == 3) {
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else {
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    }
  };
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  int32_t cur = from;
  for (int i = 0; i < len; ++i) {
    int32_t next = i + 1 == len ? to : add_node();
    add_bytes(cur, a[i], b[i], next);
    cur = next;
  }
}

Status Nfa::finish(Frag whole) {
  if (overflowed_) {
    return invalid_argument("the constraint is too large: more than " + std::to_string(max_nodes_) +
                            " automaton states");
  }
  start_ = whole.in;
  accept_ = whole.out;
  // Fewest bytes to accept: a breadth-first search backwards where epsilon edges cost nothing
  // (0-1 BFS on the reversed graph).
  const size_t n = nodes_.size();
  std::vector<std::vector<std::pair<int32_t, int32_t>>> rev(n);  // (from, cost)
  for (size_t i = 0; i < n; ++i) {
    for (const ByteEdge& e : nodes_[i].bytes)
      rev[static_cast<size_t>(e.to)].push_back({static_cast<int32_t>(i), 1});
    for (int32_t t : nodes_[i].eps)
      rev[static_cast<size_t>(t)].push_back({static_cast<int32_t>(i), 0});
  }
  dist_.assign(n, kUnreachable);
  std::deque<int32_t> q;
  dist_[static_cast<size_t>(accept_)] = 0;
  q.push_back(accept_);
  while (!q.empty()) {
    int32_t v = q.front();
    q.pop_front();
    const int32_t d = dist_[static_cast<size_t>(v)];
    for (auto [u, c] : rev[static_cast<size_t>(v)]) {
      if (d + c < dist_[static_cast<size_t>(u)]) {
        dist_[static_cast<size_t>(u)] = d + c;
        c == 0 ? q.push_front(u) : q.push_back(u);
      }
    }
  }
  if (dist_[static_cast<size_t>(start_)] == kUnreachable)
    return invalid_argument("the constraint admits no text at all");
  return Status::ok();
}

}  // namespace hr::grammar
