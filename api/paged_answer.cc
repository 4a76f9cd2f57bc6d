#include "api/paged_answer.h"

#include <stdexcept>

namespace hr::api {

namespace {

struct PagedBody {
  enum class Part { kHead, kPages, kTail, kDone };
  std::string head;
  PageReader next_page;
  std::string tail;
  std::shared_ptr<void> hold;
  Part part = Part::kHead;

  bool next(std::string* out) {
    switch (part) {
      case Part::kHead:
        *out = std::move(head);
        part = Part::kPages;
        return true;
      case Part::kPages: {
        Result<bool> more = next_page(out);
        if (!more.is_ok()) throw std::runtime_error(more.status().to_string());
        if (!*more) part = Part::kTail;
        return true;
      }
      case Part::kTail:
        *out += tail;
        part = Part::kDone;
        hold.reset();
        return true;
      case Part::kDone:
        return false;
    }
    return false;
  }
};

}  // namespace

http::BodyStream paged_body(std::string head, PageReader next_page, std::string tail,
                            std::shared_ptr<void> hold) {
  auto body = std::make_shared<PagedBody>(
      PagedBody{std::move(head), std::move(next_page), std::move(tail), std::move(hold)});
  return [body](std::string* out) { return body->next(out); };
}

std::string collect_body(const http::BodyStream& stream) {
  std::string whole, piece;
  while (stream(&piece)) {
    whole += piece;
    piece.clear();
  }
  return whole;
}

}  // namespace hr::api
