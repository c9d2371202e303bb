//! What one client can make Tollgate hold: undecodable and oversized gRPC messages, the
//! HTTP/2 stream limit, and idle, slow or silent connections on both ports.

use std::time::Duration;

use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_testkit::grpc::{Code, code, request};
use tollgate_testkit::h2_frames;
use tollgate_testkit::raw_grpc::{RawGrpc, SHOULD_RATE_LIMIT, frame, frame_head};

use crate::in_process::InProcess;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

const OK: i32 = 0;
const INVALID_ARGUMENT: i32 = 3;
const OUT_OF_RANGE: i32 = 11;

/// Long enough for a closed connection to be noticed on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(15);

#[tokio::test]
async fn undecodable_requests_are_invalid_argument() {
    let server = InProcess::rules(RULES).start();
    let mut grpc = RawGrpc::connect(server.grpc_addr()).await;
    let valid = request("d", &[&[("k", "v")]]).encode_to_vec();
    let ended = grpc.call(SHOULD_RATE_LIMIT, frame(&valid), true).await;
    assert_eq!(ended.status, OK, "{ended:?}");

    // A field tag of 0 is not protobuf.
    let ended = grpc.call(SHOULD_RATE_LIMIT, frame(&[0, 1, 2]), true).await;
    assert_eq!(ended.status, INVALID_ARGUMENT, "{ended:?}");
    assert!(
        ended.message.contains("not a RateLimitRequest"),
        "{ended:?}"
    );
    // Field 1 (domain) holding bytes that are not UTF-8.
    let ended = grpc
        .call(SHOULD_RATE_LIMIT, frame(&[0x0a, 0x02, 0xc3, 0x28]), true)
        .await;
    assert_eq!(ended.status, INVALID_ARGUMENT, "{ended:?}");
    // A message cut short by the end of the stream.
    let mut cut = frame_head(100);
    cut.extend_from_slice(&valid);
    let ended = grpc.call(SHOULD_RATE_LIMIT, cut.freeze(), true).await;
    assert_ne!(ended.status, OK, "{ended:?}");
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_refused_before_it_arrives() {
    let server = InProcess::rules(RULES)
        .args(["--grpc-max-message-bytes", "2048"])
        .start();
    let mut grpc = RawGrpc::connect(server.grpc_addr()).await;
    let sized = |n: usize| {
        let value = "v".repeat(n);
        request("d", &[&[("k", &value)]]).encode_to_vec()
    };
    let ended = grpc
        .call(SHOULD_RATE_LIMIT, frame(&sized(2000)), true)
        .await;
    assert_eq!(ended.status, OK, "{ended:?}");
    let ended = grpc
        .call(SHOULD_RATE_LIMIT, frame(&sized(2100)), true)
        .await;
    assert_eq!(ended.status, OUT_OF_RANGE, "{ended:?}");

    // A client announcing 4 MiB and sending a little: the answer comes without the rest,
    // so nothing waits for (or buffers) the message.
    let mut head = frame_head(4 << 20);
    head.extend_from_slice(&[0; 1024]);
    let ended = grpc.call(SHOULD_RATE_LIMIT, head.freeze(), false).await;
    assert_eq!(ended.status, OUT_OF_RANGE, "{ended:?}");
    assert!(ended.message.contains("too large"), "{ended:?}");
}

#[tokio::test]
async fn the_grpc_port_advertises_its_stream_limit() {
    for (args, want) in [
        (&[][..], 128),
        (&["--grpc-max-concurrent-streams", "3"][..], 3),
    ] {
        let server = InProcess::rules(RULES).args(args).start();
        let mut grpc = RawGrpc::connect(server.grpc_addr()).await;
        let valid = request("d", &[&[("k", "v")]]).encode_to_vec();
        // A completed call has brought the server's settings in.
        assert_eq!(
            grpc.call(SHOULD_RATE_LIMIT, frame(&valid), true)
                .await
                .status,
            OK
        );
        assert_eq!(grpc.max_concurrent_streams(), want, "{args:?}");
    }
}

/// After a stall (a paused or CPU-throttled instance), a client's calls and their
/// cancellations (Envoy gives up on a call after its timeout, 20 ms by default) arrive
/// together, before the server has taken up any of them. The connection stays up, with
/// every other call on it: h2's default closes it past 20 such cancelled calls waiting.
/// What they may hold stays bounded, in proportion to the connection's stream limit:
/// with 2 streams, 100 such calls are too many.
#[tokio::test]
async fn calls_cancelled_while_the_server_stalled_leave_the_connection_up() {
    let valid = request("d", &[&[("k", "v")]]).encode_to_vec();
    let (burst, last) = h2_frames::cancelled_calls_then_one(100, &valid);
    for (args, kept) in [
        (&[][..], true),
        (&["--grpc-max-concurrent-streams", "2"][..], false),
    ] {
        let server = InProcess::rules(RULES).args(args).start();
        let mut conn = TcpStream::connect(server.grpc_addr())
            .await
            .expect("connect to the gRPC port");
        conn.write_all(&burst).await.expect("send the burst");
        let answered = tokio::time::timeout(DEADLINE, h2_frames::answered(&mut conn, last))
            .await
            .expect("an answer or a GOAWAY");
        if kept {
            answered.unwrap_or_else(|e| panic!("{args:?}: {e}"));
        } else {
            let e = answered.expect_err("closed");
            assert!(e.contains("GOAWAY, error code 0xb"), "{args:?}: {e}");
        }
    }
}

/// Whether the server closed `conn`: its next read ends (an HTTP/1 408 may come first).
async fn closed_by_server(conn: &mut TcpStream) -> Result<(), String> {
    let mut buf = [0; 1024];
    let read = tokio::time::timeout(DEADLINE, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    });
    read.await
        .map_err(|_| format!("still open after {DEADLINE:?}"))
}

#[tokio::test]
async fn idle_and_slow_connections_are_closed_and_free_their_slots() {
    let server = InProcess::rules(RULES)
        .args([
            "--max-connections",
            "2",
            "--connection-idle-timeout",
            "1s",
            "--http-header-read-timeout",
            "1s",
        ])
        .start();
    // Both HTTP slots taken: one connection silent, one sending half a request.
    let mut idle = TcpStream::connect(server.http_addr())
        .await
        .expect("connect");
    let mut slow = TcpStream::connect(server.http_addr())
        .await
        .expect("connect");
    slow.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("half a request");
    // A third waits for a slot, which only the timeouts can free.
    let third = tokio::spawn({
        let addr = server.http_addr();
        async move { tollgate_testkit::http::get(addr, "/healthcheck").await }
    });
    closed_by_server(&mut idle)
        .await
        .expect("idle HTTP connection");
    closed_by_server(&mut slow)
        .await
        .expect("slow HTTP connection");
    let third = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("the third connection is served once a slot is free")
        .expect("request task");
    assert_eq!(third.status, 200);

    let mut idle_grpc = TcpStream::connect(server.grpc_addr())
        .await
        .expect("connect");
    closed_by_server(&mut idle_grpc)
        .await
        .expect("idle gRPC connection");
}

/// Every slot of both ports held by sockets that never bring a request (no byte, half an
/// HTTP/2 preface, a preface and nothing more): they are closed once the first-request
/// timeout passes, long before the idle timeout, so health checks and calls get through.
#[tokio::test]
async fn silent_connections_are_closed_after_the_first_request_timeout() {
    const FIRST_REQUEST: Duration = Duration::from_secs(2);
    let server = InProcess::rules(RULES)
        .args(["--max-connections", "20"])
        .args(["--connection-first-request-timeout", "2s"])
        .start();
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut silent = Vec::new();
    for i in 0..20 {
        silent.push(
            TcpStream::connect(server.http_addr())
                .await
                .expect("connect"),
        );
        let mut grpc = TcpStream::connect(server.grpc_addr())
            .await
            .expect("connect");
        let sent: &[u8] = match i % 3 {
            0 => b"",
            1 => &preface[..10],
            _ => preface,
        };
        grpc.write_all(sent).await.expect("write");
        silent.push(grpc);
    }
    let asked = std::time::Instant::now();
    let health = server.get("/healthcheck").await;
    assert_eq!(health.status, 200);
    let waited = asked.elapsed();
    assert!(
        waited < FIRST_REQUEST + Duration::from_secs(5),
        "/healthcheck answered after {waited:?}"
    );
    let mut rls = server.client().await;
    assert_eq!(code(&rls.check("d", &[("k", "v")]).await), Code::Ok);
    for conn in &mut silent {
        closed_by_server(conn).await.expect("a silent connection");
    }
}
