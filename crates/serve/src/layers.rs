//! The checks of `docs/security.md` as middleware around the router, in
//! the order a request meets them: the `Host` and the `Origin` (with the
//! CORS preflight and headers), the web page (served without the token),
//! the token, and the body's media type. Each refuses a request before any
//! endpoint sees it; the body's size cap and timeout are the body
//! extractor's (`body.rs`), and the connection caps and timeouts are the
//! accept loop's (`conn.rs`).

use std::sync::Arc;

use axum::body::HttpBody;
use axum::extract::{OriginalUri, Request, State};
use axum::http::header::WWW_AUTHENTICATE;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::guard::{self, Auth, Refusal, RefusalLog};
use crate::health;
use crate::reply::{error, json_response};
use crate::state::Server;
use crate::ui;

/// The `Host` must be one the server is reached by, and a page's `Origin`
/// the server's own or an allowed one; an allowed other origin gets its
/// CORS headers on every answer, and its preflight is answered here.
pub(crate) async fn host_and_origin(
    State(server): State<Arc<Server>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    if let Err(refusal) = server.guard.check_host(&parts) {
        return refused(&server.refusals, refusal);
    }
    let cors = match server.guard.check_origin(&parts) {
        Ok(cors) => cors,
        Err(refusal) => return refused(&server.refusals, refusal),
    };
    let preflight = cors.is_some() && guard::is_preflight(&parts);
    let mut response = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(Request::from_parts(parts, body)).await
    };
    if let Some(origin) = cors {
        guard::add_cors(response.headers_mut(), origin, preflight);
    }
    response
}

/// The web page (`/`, `/ui/…`) holds no secret: it is served without the
/// token, and sends the token with each API call it makes. Its paths are
/// matched as the client sent them, before the router's trailing-slash
/// tolerance.
pub(crate) async fn page(request: Request, next: Next) -> Response {
    let path = match request.extensions().get::<OriginalUri>() {
        Some(original) => original.path(),
        None => request.uri().path(),
    };
    if let Some(response) = ui::respond(request.method(), path) {
        return response;
    }
    next.run(request).await
}

/// Every request but a bare health check needs `Authorization: Bearer
/// <token>`; a bare health check (a load balancer, a supervisor) learns
/// only whether the host serves.
pub(crate) async fn authorize(
    State(server): State<Arc<Server>>,
    request: Request,
    next: Next,
) -> Response {
    match server.guard.authorize(request.headers()) {
        Auth::Valid => next.run(request).await,
        Auth::Missing
            if request.method() == Method::GET && request.uri().path() == "/v1/health" =>
        {
            let (status, body) = health::report(&server.api, false).await;
            json_response(status, &body)
        }
        Auth::Missing => unauthorized("this API needs `Authorization: Bearer <token>`"),
        Auth::Wrong => unauthorized("the token is not this server's"),
    }
}

/// A request with a body must say it is JSON: a page of another origin
/// can send a `text/plain` body without a preflight, never a JSON one.
pub(crate) async fn json_only(request: Request, next: Next) -> Response {
    if !request.body().is_end_stream() && !guard::is_json(request.headers()) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a request body must be JSON, with `Content-Type: application/json`",
        );
    }
    next.run(request).await
}

/// The answer to a refused request, and a warning about it, as often as
/// `log` allows (a page can send refused requests in a loop).
fn refused(log: &RefusalLog, refusal: Refusal) -> Response {
    let unlogged = log.admit(&refusal, std::time::Instant::now());
    match refusal {
        Refusal::NoHost => error(StatusCode::BAD_REQUEST, "the request has no Host header"),
        Refusal::Repeated(name) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(
                    header = name,
                    unlogged,
                    "refused a request with more than one header of a name that must be single"
                );
            }
            error(
                StatusCode::BAD_REQUEST,
                format!("the request has more than one `{name}` header"),
            )
        }
        Refusal::Host(host) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(%host, unlogged, "refused a request for another host name (DNS rebinding?)");
            }
            error(
                StatusCode::FORBIDDEN,
                format!("this server is not reached as `{host}`"),
            )
        }
        Refusal::Origin(origin) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(%origin, unlogged, "refused a request from a page of another origin");
            }
            error(
                StatusCode::FORBIDDEN,
                format!("pages of `{origin}` may not call this API"),
            )
        }
    }
}

fn unauthorized(message: &str) -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, message);
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}
