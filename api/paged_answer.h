// An answer too large to build whole in memory (the results of a big batch): its `head`, then
// the pages `next_page` appends one at a time, then its `tail`, as a body the server pulls a
// piece at a time (http::BodyStream), reading the next page only once the last one is written.
// A page that cannot be read throws, so the server cuts the connection off before the body's end
// and the client sees it incomplete rather than complete. `hold` is kept until the answer ends
// (a ResponseSlots slot).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "http/server.h"

namespace hr::api {

// Appends the next page to `out`; true when more may follow, false after the last.
using PageReader = std::function<Result<bool>(std::string* out)>;

http::BodyStream paged_body(std::string head, PageReader next_page, std::string tail,
                            std::shared_ptr<void> hold);

// The whole body of a stream, for callers that want the answer in one piece.
std::string collect_body(const http::BodyStream& stream);

}  // namespace hr::api
