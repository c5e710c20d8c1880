//! A static web server on loopback, for local WebMCP pages.
//!
//! Browsers expose `document.modelContext` only in secure contexts, and
//! `http://127.0.0.1` is one; a page opened from a folder this way behaves
//! as it would on a real site (its own origin, storage, navigation), which
//! `file://` does not.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::ToolsError;

/// A folder served over HTTP on `127.0.0.1`, until dropped.
///
/// A path names a file under the folder; a path that names no file and has
/// no extension (`/products/p-17`) gets the folder's `index.html`, so a page
/// can route its own addresses, as single-page sites do.
#[derive(Debug)]
pub struct LoopbackSite {
    addr: SocketAddr,
    /// Stops the accept loop and the open connections on drop.
    stop: CancellationToken,
}

impl Drop for LoopbackSite {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LoopbackSite {
    /// Serves `root` on a free port of `127.0.0.1`.
    pub async fn serve(root: impl Into<PathBuf>) -> Result<Self, ToolsError> {
        Self::serve_on(root, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Serves `root` on `addr`.
    pub async fn serve_on(root: impl Into<PathBuf>, addr: SocketAddr) -> Result<Self, ToolsError> {
        let root: PathBuf = root.into();
        if !root.join("index.html").is_file() {
            return Err(ToolsError::io(
                format!("cannot serve {}", root.display()),
                std::io::Error::new(std::io::ErrorKind::NotFound, "it has no index.html"),
            ));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ToolsError::io(format!("could not listen on {addr}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ToolsError::io("could not read the listening address", e))?;
        let stop = CancellationToken::new();
        let root = Arc::new(root);
        let accept_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accept_stop.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let root = root.clone();
                let connection_stop = accept_stop.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let root = root.clone();
                        async move { Ok::<_, Infallible>(respond(&root, request).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {}
                        _ = connection_stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(Self { addr, stop })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The site's root address, `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The address of `path` on the site (`/products/p-17`).
    pub fn url_of(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file a request path names, if it stays inside `root`.
fn resolve(root: &Path, request_path: &str) -> Option<PathBuf> {
    let relative = Path::new(request_path.trim_start_matches('/'));
    // Only plain names: no `..`, no absolute parts.
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let mut path = root.join(relative);
    if request_path.ends_with('/') || request_path.is_empty() {
        path.push("index.html");
    }
    if path.is_file() {
        return Some(path);
    }
    if relative.extension().is_none() {
        return Some(root.join("index.html"));
    }
    None
}

async fn respond(root: &Path, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let status = |code: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::from(
            code.canonical_reason().unwrap_or_default(),
        )));
        *response.status_mut() = code;
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let Some(path) = resolve(root, request.uri().path()) else {
        return status(StatusCode::NOT_FOUND);
    };
    match tokio::fs::read(&path).await {
        Ok(body) => {
            let body = if request.method() == Method::HEAD {
                Bytes::new()
            } else {
                Bytes::from(body)
            };
            let mut response = Response::new(Full::new(body));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(&path)));
            // Pages under development change between runs.
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(_) => status(StatusCode::NOT_FOUND),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_root_with_a_fallback_to_index() {
        let root = std::env::temp_dir().join(format!("wma-site-test-{}", std::process::id()));
        std::fs::create_dir_all(root.join("css")).unwrap();
        std::fs::write(root.join("index.html"), "<h1>hi</h1>").unwrap();
        std::fs::write(root.join("css/shop.css"), "h1{}").unwrap();
        assert_eq!(resolve(&root, "/"), Some(root.join("index.html")));
        assert_eq!(
            resolve(&root, "/css/shop.css"),
            Some(root.join("css/shop.css"))
        );
        assert_eq!(
            resolve(&root, "/products/p-17"),
            Some(root.join("index.html"))
        );
        assert_eq!(resolve(&root, "/missing.js"), None);
        assert_eq!(resolve(&root, "/../etc/passwd"), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
