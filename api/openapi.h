// The API's contract: an OpenAPI 3.1 document of every public route (api/openapi.json, compiled
// into the binary), served without a key at GET /openapi.json.
#pragma once

#include <string_view>

namespace hr::api {

std::string_view openapi_document();

}  // namespace hr::api
