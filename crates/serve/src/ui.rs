//! The web page of `wma serve`: plain HTML, JavaScript and CSS compiled
//! into the binary, served at `GET /` and `GET /ui/…` on the same origin as
//! the API.
//!
//! The files hold no secret, so they are served without the token; the
//! page asks for the token (or reads it from the address's `#token=`
//! fragment, which browsers never send to a server) and sends it as
//! `Authorization: Bearer` with every API call, which the API checks as
//! it checks any client's. Every answer carries a Content Security Policy
//! that lets the page load and call only its own origin, run no inline
//! script, and be framed by no one: text from models, tools and web pages
//! is shown as text by the script, and the policy stops what would get
//! past that.

use std::net::SocketAddr;

use axum::body::Body;
use axum::http::header::{
    ALLOW, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderMap, HeaderValue,
    REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{Method, StatusCode};
use axum::response::Response;

use crate::reply::error;
use crate::state::Started;
use crate::token::TokenOrigin;

/// The policy of every answer under `/` and `/ui/`: the page's own
/// scripts, styles and API, nothing inline, no framing, no form posts.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

/// The files of the page: path, media type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("ui/app.css"),
    ),
    ("/ui/icon.svg", "image/svg+xml", include_str!("ui/icon.svg")),
];

/// The answer for a request of the page's paths (`/` and anything under
/// `/ui/`), or `None` for every other path, which goes on to the token
/// check and the API.
pub(crate) fn respond(method: &Method, path: &str) -> Option<Response> {
    if path != "/" && !path.starts_with("/ui/") {
        return None;
    }
    let mut response = if method != Method::GET && method != Method::HEAD {
        let mut response = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        response
    } else if let Some((_, media, content)) = FILES.iter().find(|(p, _, _)| *p == path) {
        let mut response = Response::new(Body::from(*content));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(media));
        response
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!("the page has no file {path}"),
        )
    };
    guard_headers(response.headers_mut());
    Some(response)
}

/// The headers every answer of the page's paths carries.
fn guard_headers(headers: &mut HeaderMap) {
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The page is small and changes with the binary: a stale copy from an
    // older `wma` would talk to a newer API.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The page's address for a server bound to `addr`: a loopback name when
/// it listens on every address (`0.0.0.0` is nothing a browser can open,
/// and the loopback names are always accepted).
pub fn page_address(addr: SocketAddr) -> String {
    let host = match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => "127.0.0.1".to_string(),
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) if a.ip().is_unspecified() => "[::1]".to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    format!("http://{host}:{}/", addr.port())
}

/// The line that tells the operator where the page is. A token generated
/// just now is in the address's fragment (`#token=…`), so opening the link
/// signs the page in; the token notice prints that token this once too.
/// Otherwise the address comes without it and the page asks for the
/// token, so that a token kept across starts is not copied into every log
/// the output goes to.
pub fn page_notice(started: &Started) -> String {
    let address = page_address(started.addr);
    match &started.token_origin {
        TokenOrigin::Generated(_) => {
            format!("web page: {address}#token={}", started.token.as_str())
        }
        TokenOrigin::File(path) => format!(
            "web page: {address} (it asks for the token in {}; or open {address}#token=<the token>)",
            path.display()
        ),
        TokenOrigin::Env(name) => format!(
            "web page: {address} (it asks for the token in ${name}; or open {address}#token=<the token>)"
        ),
        TokenOrigin::Given => format!("web page: {address} (it asks for the token)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_files_carry_the_policy_and_others_are_not_found() {
        let page = respond(&Method::GET, "/").unwrap();
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(
            page.headers()[CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY_VALUE
        );
        assert_eq!(page.headers()[X_CONTENT_TYPE_OPTIONS], "nosniff");
        for path in ["/ui/app.js", "/ui/app.css", "/ui/icon.svg"] {
            let file = respond(&Method::GET, path).unwrap();
            assert_eq!(file.status(), StatusCode::OK, "{path}");
        }
        let missing = respond(&Method::GET, "/ui/../v1/agents").unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            respond(&Method::POST, "/").unwrap().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert!(respond(&Method::GET, "/v1/agents").is_none());
        assert!(respond(&Method::GET, "/uix").is_none());
    }

    #[test]
    fn the_address_names_a_host_a_browser_can_open() {
        assert_eq!(
            page_address("0.0.0.0:8080".parse().unwrap()),
            "http://127.0.0.1:8080/"
        );
        assert_eq!(
            page_address("[::]:9000".parse().unwrap()),
            "http://[::1]:9000/"
        );
        assert_eq!(
            page_address("10.0.0.5:80".parse().unwrap()),
            "http://10.0.0.5:80/"
        );
    }

    #[test]
    fn the_html_loads_no_inline_script_or_style() {
        let html = include_str!("ui/index.html");
        assert!(!html.contains("<script>"), "inline script");
        assert!(!html.contains("style="), "inline style");
        assert!(!html.contains("<style"), "inline style");
        assert!(!include_str!("ui/app.js").contains("innerHTML"));
    }
}
