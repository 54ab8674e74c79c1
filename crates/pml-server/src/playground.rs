//! The playground page at `/`: the schema and prompt editors with live diagnostics, the layout,
//! `reuse` / `blend` / `full` side by side, a chat, the server's gauges. Its files are built into
//! the binary (no CDN, nothing read at run time): `index.html` and `style.css` as written,
//! `app.js` bundled by `web/playground/build.mjs` from `web/playground/src` and its one
//! dependency (the CodeJar editor). The page talks to the server only through the public API.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX_HTML: &str = include_str!("../assets/playground/index.html");
const STYLE_CSS: &str = include_str!("../assets/playground/style.css");
const APP_JS: &str = include_str!("../assets/playground/app.js");

/// The page's routes, merged into the API's router when the UI is on.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/playground/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
        .route(
            "/playground/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
}

/// What the page may load and run: its own script and styles, calls to this server, nothing
/// inline (so uploaded text the page shows can never become script), and no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' \
    'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri \
    'none'; form-action 'none'; frame-ancestors 'none'";

async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The files change only with the binary; a restarted server may serve new ones.
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        ],
        body,
    )
}
