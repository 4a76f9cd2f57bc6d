// The one place where a Status becomes an HTTP status code: every server, route and client of
// this project picks codes here.
#pragma once

#include "base/status.h"

namespace hr::http {

int http_status_for(StatusCode code);

}  // namespace hr::http
