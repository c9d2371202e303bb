//! HTTP/2 written byte by byte, for what no HTTP/2 library sends: many calls and their
//! cancellations arriving together in one piece, as a server finds them after a stall (a
//! paused or CPU-throttled process) when its client gave up on each call meanwhile; a
//! request without `:authority`.

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

use crate::raw_grpc::{SHOULD_RATE_LIMIT, frame};

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const CANCEL: u32 = 0x8;

/// The connection's opening, `cancelled` `ShouldRateLimit` calls carrying `message`, each
/// followed at once by its RST_STREAM (CANCEL), then one more call left standing; and the
/// stream id of that last call.
pub fn cancelled_calls_then_one(cancelled: u32, message: &[u8]) -> (Vec<u8>, u32) {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    put_frame(&mut out, SETTINGS, 0, 0, &[]);
    let head = call_head();
    let body = frame(message);
    let mut id = 1;
    for _ in 0..cancelled {
        put_call(&mut out, id, &head, &body);
        put_frame(&mut out, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
        id += 2;
    }
    put_call(&mut out, id, &head, &body);
    (out, id)
}

/// Reads the server's frames until the head of the answer on stream `id`; the GOAWAY
/// (its error code and debug text) or the close that came first instead.
pub async fn answered(conn: &mut TcpStream, id: u32) -> Result<(), String> {
    loop {
        match read_frame(conn, id).await? {
            (HEADERS, _, stream, _) if stream == id => return Ok(()),
            (GOAWAY, _, _, payload) => return Err(goaway(&payload)),
            _ => {}
        }
    }
}

/// The connection's opening and, on stream 1, `GET path` with a `:scheme` but neither
/// `:authority` nor `host`, which HTTP/2 libraries always send.
pub fn get_without_authority(path: &str) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    put_frame(&mut out, SETTINGS, 0, 0, &[]);
    // :method GET and :scheme http, from HPACK's static table (indices 2 and 6).
    let mut head = vec![0x82, 0x86];
    put_literal(&mut head, &[0x04], path.as_bytes());
    put_frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &head);
    out
}

/// Reads the server's frames until the answer on stream `id` ends; its body, or what
/// ended the stream or the connection first (RST_STREAM, GOAWAY, a close).
pub async fn answer_body(conn: &mut TcpStream, id: u32) -> Result<String, String> {
    let mut body = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(conn, id).await?;
        match kind {
            DATA | HEADERS if stream == id => {
                if kind == DATA {
                    body.extend_from_slice(&payload);
                }
                if flags & END_STREAM != 0 {
                    return Ok(String::from_utf8_lossy(&body).into_owned());
                }
            }
            RST_STREAM if stream == id => {
                return Err(format!("stream {id} reset: {payload:?}"));
            }
            GOAWAY => return Err(goaway(&payload)),
            _ => {}
        }
    }
}

/// The next frame: its type, flags, stream and payload.
async fn read_frame(conn: &mut TcpStream, id: u32) -> Result<(u8, u8, u32, Vec<u8>), String> {
    let mut header = [0u8; 9];
    conn.read_exact(&mut header)
        .await
        .map_err(|e| format!("the connection ended before stream {id} was answered: {e}"))?;
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload)
        .await
        .map_err(|e| format!("a frame cut short: {e}"))?;
    Ok((header[3], header[4], stream, payload))
}

/// A GOAWAY's error code and debug text.
fn goaway(payload: &[u8]) -> String {
    let code = payload
        .get(4..8)
        .map_or(0, |c| u32::from_be_bytes(c.try_into().expect("four bytes")));
    let debug = String::from_utf8_lossy(payload.get(8..).unwrap_or_default());
    format!("GOAWAY, error code {code:#x}: {debug:?}")
}

/// HEADERS (the request head) and DATA (the message, ending the stream) of one call.
fn put_call(out: &mut Vec<u8>, id: u32, head: &[u8], body: &[u8]) {
    put_frame(out, HEADERS, END_HEADERS, id, head);
    put_frame(out, DATA, END_STREAM, id, body);
}

/// The head of a `ShouldRateLimit` call in HPACK, every field literal and never indexed,
/// so that each call's block stands alone.
fn call_head() -> Vec<u8> {
    // :method POST and :scheme http, from HPACK's static table (indices 3 and 6).
    let mut out = vec![0x83, 0x86];
    // Literals named by static index: :path (4), :authority (1), content-type (31).
    put_literal(&mut out, &[0x04], SHOULD_RATE_LIMIT.as_bytes());
    put_literal(&mut out, &[0x01], b"tollgate");
    put_literal(&mut out, &[0x0f, 0x10], b"application/grpc");
    // te, not in the static table: a literal name too.
    out.push(0x00);
    put_string(&mut out, b"te");
    put_string(&mut out, b"trailers");
    out
}

fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    put_string(out, value);
}

/// A string without Huffman coding; every one here is under 127 bytes.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(u8::try_from(s.len()).expect("a short string"));
    out.extend_from_slice(s);
}

fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a small frame");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}
