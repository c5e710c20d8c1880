//! The checks every request passes before it reaches an endpoint: the
//! `Host` (DNS rebinding), the `Origin` (other sites' pages), the token and
//! the body's media type.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, AUTHORIZATION, CONTENT_TYPE, HOST,
    HeaderMap, HeaderValue, ORIGIN, VARY,
};
use axum::http::request::Parts;
use parking_lot::Mutex;

use crate::reply::RUN_ID_HEADER;
use crate::token::Token;
use wma_config::server::ServerOptions;

/// What the token check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// The request carries the token.
    Valid,
    /// The request carries no `Authorization` header.
    Missing,
    /// It carries one, with another token or scheme.
    Wrong,
}

/// Why a request is refused before any endpoint sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `Host` header (HTTP/1.1 requires one): 400.
    NoHost,
    /// A `Host` the server is not reached by: 403.
    Host(String),
    /// An `Origin` not in the allow-list: 403.
    Origin(String),
    /// More than one header of this name (`Host`, `Origin`): 400. Two
    /// values leave it to each reader which one counts, and a proxy in
    /// front may read the other one than this server.
    Repeated(&'static str),
}

impl Refusal {
    /// The kind of refusal, for [`RefusalLog`].
    fn kind(&self) -> &'static str {
        match self {
            Self::NoHost => "no-host",
            Self::Host(_) => "host",
            Self::Origin(_) => "origin",
            Self::Repeated(_) => "repeated-header",
        }
    }
}

/// How often a warning about refused requests of one kind is logged at
/// most; the refusals in between are counted into the next warning. A page
/// that sends requests in a loop must not fill the log (and its disk).
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate-limits the warnings about refused requests: per kind of refusal,
/// the first one is logged, then at most one per [`REFUSAL_LOG_INTERVAL`],
/// saying how many were refused in between without a line of their own.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    /// Per kind: when the last warning was logged, and the refusals since.
    kinds: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl RefusalLog {
    /// Whether to log `refusal` at `now`: `Some(n)` with the refusals of
    /// its kind left unlogged since the last warning, `None` to count it
    /// silently.
    pub(crate) fn admit(&self, refusal: &Refusal, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock();
        match kinds.get_mut(refusal.kind()) {
            Some((last, unlogged)) if now.duration_since(*last) < REFUSAL_LOG_INTERVAL => {
                *unlogged += 1;
                None
            }
            Some((last, unlogged)) => {
                *last = now;
                Some(std::mem::take(unlogged))
            }
            None => {
                kinds.insert(refusal.kind(), (now, 0));
                Some(0)
            }
        }
    }
}

/// The one value of header `name`: `Err` when there are several.
fn single<'a>(
    headers: &'a HeaderMap,
    name: &axum::http::HeaderName,
    label: &'static str,
) -> Result<Option<&'a HeaderValue>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Refusal::Repeated(label));
    }
    Ok(first)
}

/// The request checks, built once per server.
#[derive(Debug)]
pub(crate) struct Guard {
    token: Token,
    /// Accepted `Host` values, lowercase.
    hosts: Vec<String>,
    /// Allowed origins, lowercase and without a trailing slash.
    origins: Vec<String>,
}

impl Guard {
    pub(crate) fn new(token: Token, listen: SocketAddr, options: &ServerOptions) -> Self {
        let port = listen.port();
        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "[::1]".to_string(),
        ];
        let listen_ip = match listen {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        // An unspecified address (0.0.0.0) is nothing a client can send;
        // the operator names the real ones in `allowed_hosts`.
        if !listen.ip().is_unspecified() {
            names.push(listen_ip);
        }
        let mut hosts: Vec<String> = names.iter().map(|n| format!("{n}:{port}")).collect();
        // Clients leave the port out when it is the scheme's default.
        if port == 80 {
            hosts.extend(names);
        }
        hosts.extend(options.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()));
        let origins = options
            .allowed_origins
            .iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
            .collect();
        Self {
            token,
            hosts,
            origins,
        }
    }

    /// The `Host` must be one the server is reached by. A page on a name
    /// that an attacker re-pointed at this machine (DNS rebinding) sends
    /// that name, and is refused here even though it reached the port.
    pub(crate) fn check_host(&self, request: &Parts) -> Result<(), Refusal> {
        let Some(host) = single(&request.headers, &HOST, "Host")? else {
            return Err(Refusal::NoHost);
        };
        let host = String::from_utf8_lossy(host.as_bytes()).to_ascii_lowercase();
        if !self.hosts.contains(&host) {
            return Err(Refusal::Host(host));
        }
        // An absolute request target names the host too, and wins over the
        // header where a proxy reads it; it must pass the same check.
        if let Some(authority) = request.uri.authority() {
            let authority = authority.as_str().to_ascii_lowercase();
            if !self.hosts.contains(&authority) {
                return Err(Refusal::Host(authority));
            }
        }
        Ok(())
    }

    /// A request from a page carries its `Origin`; only allowed ones pass.
    /// Requests without one (curl, scripts, same-origin navigation) pass
    /// to the token check. The server's own page (`GET /`) sends the
    /// origin it was loaded from, which is the `Host` the request names
    /// (already checked by [`Guard::check_host`]): that one passes too,
    /// without CORS headers, since it needs none. Returns an allowed other
    /// origin, for CORS headers.
    pub(crate) fn check_origin(&self, request: &Parts) -> Result<Option<HeaderValue>, Refusal> {
        let Some(origin) = single(&request.headers, &ORIGIN, "Origin")? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(origin.as_bytes()).to_ascii_lowercase();
        if is_own_origin(&text, request) {
            return Ok(None);
        }
        if self.origins.contains(&text) {
            Ok(Some(origin.clone()))
        } else {
            Err(Refusal::Origin(text))
        }
    }

    /// Whether the request carries `Authorization: Bearer <token>`.
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Auth {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return Auth::Missing;
        };
        let value = value.as_bytes();
        let scheme = b"bearer ";
        if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Auth::Wrong;
        }
        if self.token.matches(value[scheme.len()..].trim_ascii()) {
            Auth::Valid
        } else {
            Auth::Wrong
        }
    }
}

/// Whether `origin` (lowercase) is the origin the request reached the
/// server as: `http://` (or `https://`, behind a proxy that ends TLS)
/// followed by exactly the request's `Host`. A page of another site sends
/// its own origin, and a rebound name fails the `Host` check before this.
fn is_own_origin(origin: &str, request: &Parts) -> bool {
    let Some(host) = request.headers.get(HOST) else {
        return false;
    };
    let host = String::from_utf8_lossy(host.as_bytes()).to_ascii_lowercase();
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    !host.is_empty() && authority == Some(host.as_str())
}

/// Whether a `Content-Type` says JSON (`application/json`, any parameters).
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether a request is a CORS preflight (an allowed page asking before it
/// sends a request with a token or a JSON body).
pub(crate) fn is_preflight(request: &Parts) -> bool {
    request.method == axum::http::Method::OPTIONS
        && request
            .headers
            .contains_key(axum::http::header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The CORS headers for an allowed origin: it may read the answer (and
/// the run id header), and send the token and a JSON body.
pub(crate) fn add_cors(headers: &mut HeaderMap, origin: HeaderValue, preflight: bool) {
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(VARY, HeaderValue::from_static("origin"));
    headers.insert(
        ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(RUN_ID_HEADER),
    );
    if preflight {
        headers.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, PUT"),
        );
        headers.insert(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "7c1f0e9a3b5d2c8e4f6a0b1c9d8e7f6a5b4c3d2e";

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::builder().uri("/v1/agents");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn guard(options: &ServerOptions) -> Guard {
        let token = Token::parse(TOKEN).unwrap();
        Guard::new(token, "127.0.0.1:8080".parse().unwrap(), options)
    }

    #[test]
    fn loopback_names_and_configured_hosts_pass_and_others_do_not() {
        let options = ServerOptions {
            allowed_hosts: vec!["Agents.Example.com".to_string()],
            ..ServerOptions::default()
        };
        let guard = guard(&options);
        for host in [
            "127.0.0.1:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
            "agents.example.com",
        ] {
            assert_eq!(
                guard.check_host(&parts(&[("host", host)])),
                Ok(()),
                "{host}"
            );
        }
        for host in ["evil.example:8080", "localhost", "127.0.0.1:8081"] {
            assert!(
                guard.check_host(&parts(&[("host", host)])).is_err(),
                "{host}"
            );
        }
        assert_eq!(guard.check_host(&parts(&[])), Err(Refusal::NoHost));
    }

    #[test]
    fn the_servers_own_origin_passes_without_cors_and_other_sites_do_not() {
        let guard = guard(&ServerOptions {
            allowed_origins: vec!["https://app.example.com".to_string()],
            ..ServerOptions::default()
        });
        let check = |host: &str, origin: &str| {
            guard.check_origin(&parts(&[("host", host), ("origin", origin)]))
        };
        // The page the server itself serves, reached by either name.
        assert_eq!(check("127.0.0.1:8080", "http://127.0.0.1:8080"), Ok(None));
        assert_eq!(check("localhost:8080", "http://LOCALHOST:8080"), Ok(None));
        // A configured origin gets CORS headers.
        assert!(matches!(
            check("127.0.0.1:8080", "https://app.example.com"),
            Ok(Some(_))
        ));
        // Another site, another port of this machine, a name the request
        // was not sent to, an opaque origin: refused.
        for (host, origin) in [
            ("127.0.0.1:8080", "http://evil.example"),
            ("127.0.0.1:8080", "http://127.0.0.1:8081"),
            ("127.0.0.1:8080", "http://localhost:8080"),
            ("127.0.0.1:8080", "http://127.0.0.1:8080.evil.example"),
            ("127.0.0.1:8080", "null"),
        ] {
            assert!(
                matches!(check(host, origin), Err(Refusal::Origin(_))),
                "{host} {origin}"
            );
        }
        assert!(
            guard
                .check_origin(&parts(&[("origin", "http://127.0.0.1:8080")]))
                .is_err()
        );
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        let guard = guard(&ServerOptions::default());
        let headers = |v: &str| parts(&[("authorization", v)]).headers;
        let token = TOKEN.to_string();
        assert_eq!(
            guard.authorize(&headers(&format!("Bearer {token}"))),
            Auth::Valid
        );
        assert_eq!(
            guard.authorize(&headers(&format!("bearer {token}"))),
            Auth::Valid
        );
        assert_eq!(
            guard.authorize(&headers(&format!("Bearer {}", token.to_uppercase()))),
            Auth::Wrong
        );
        assert_eq!(
            guard.authorize(&headers(&format!("Basic {token}"))),
            Auth::Wrong
        );
        assert_eq!(guard.authorize(&parts(&[]).headers), Auth::Missing);
    }

    #[test]
    fn a_repeated_host_or_origin_is_refused() {
        let guard = guard(&ServerOptions::default());
        let two_hosts = parts(&[("host", "127.0.0.1:8080"), ("host", "evil.example")]);
        assert_eq!(guard.check_host(&two_hosts), Err(Refusal::Repeated("Host")));
        let two_origins = parts(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(guard.check_host(&two_origins), Ok(()));
        assert_eq!(
            guard.check_origin(&two_origins),
            Err(Refusal::Repeated("Origin"))
        );
    }

    #[test]
    fn refusal_warnings_are_one_per_kind_and_interval_with_a_count() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let origin = Refusal::Origin("http://evil.example".into());
        let host = Refusal::Host("evil.example".into());
        assert_eq!(log.admit(&origin, start), Some(0));
        for i in 1..=500 {
            assert_eq!(log.admit(&origin, start + Duration::from_millis(i)), None);
        }
        // Another kind has its own allowance.
        assert_eq!(log.admit(&host, start), Some(0));
        assert_eq!(log.admit(&origin, start + REFUSAL_LOG_INTERVAL), Some(500));
        assert_eq!(log.admit(&origin, start + REFUSAL_LOG_INTERVAL), None);
    }

    #[test]
    fn json_with_parameters_is_json() {
        let headers = |v: &str| parts(&[("content-type", v)]).headers;
        assert!(is_json(&headers("application/json")));
        assert!(is_json(&headers("Application/JSON; charset=utf-8")));
        assert!(!is_json(&headers("text/plain")));
        assert!(!is_json(&headers("application/jsonx")));
        assert!(!is_json(&parts(&[]).headers));
    }
}
