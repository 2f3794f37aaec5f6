// The built-in chat page (webui/index.html, embedded into the binary at build time): GET / and
// GET /index.html, as llama-server serves its web UI. The page needs no API key to load (it holds
// no secrets); the API calls it makes send the key the user enters.
#pragma once

namespace httplib {
class Server;
}  // namespace httplib

namespace moe::http {

// Registers GET / and GET /index.html on `s`: the page as text/html with a Content-Security-Policy
// that allows only its own inline style and script (by hash) and same-origin fetches.
void add_webui_routes(httplib::Server& s);

}  // namespace moe::http
