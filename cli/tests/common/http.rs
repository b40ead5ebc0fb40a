//! A tiny HTTP/1.1 GET over `tokio::net::TcpStream`, for the CLI's `--http`
//! endpoints (no HTTP client dependency).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: status code, lower-cased headers, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Answer {
    /// The body parsed as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// `GET path` from `addr` (`IP:PORT`), with `Connection: close`; the
/// answer once the server closed the connection.
pub async fn get(addr: &str, path: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("headers end");
    let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("status line {status_line:?}"));
    let headers = headers.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Answer {
        status,
        headers,
        body,
    }
}

/// The body of a chunked answer.
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}
