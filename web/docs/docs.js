// The API reference: Swagger UI over the server's own /openapi.json, with nothing fetched from
// elsewhere (no validator badge).
"use strict";

if (typeof window.SwaggerUIBundle === "function") {
  window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    tryItOutEnabled: false,
  });
} else {
  document.getElementById("no-viewer").hidden = false;
}
