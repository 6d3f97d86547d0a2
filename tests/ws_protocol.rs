//! End to end over loopback, a raw WebSocket client that breaks the protocol: the server
//! closes with the code that names the fault and a short reason (1002 for an unmasked
//! frame, 1007 for a text frame that is not UTF-8), not with a close frame that has none.

mod support;

use std::time::Duration;

use support::{config_toml, start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upgrades a raw connection to `/v1/ws`; returns it after the server's 101 head.
async fn upgraded(addr: std::net::SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let head = "GET /v1/ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.expect("handshake written");
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tcp.read(&mut byte).await.expect("handshake read");
        assert_eq!(
            n,
            1,
            "the server closed during the handshake: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&got);
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    tcp
}

/// The first close frame the server sends: its code and reason.
async fn close_frame(tcp: &mut TcpStream) -> (u16, String) {
    let mut read = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("no hang")
            .expect("read");
        assert!(n > 0, "the connection ended without a close frame: {read:?}");
        read.extend_from_slice(&buf[..n]);
        // Server frames are unmasked; skip any that are not a close (pings).
        let mut at = 0;
        while read.len() >= at + 2 {
            let (opcode, len) = (read[at] & 0x0f, usize::from(read[at + 1] & 0x7f));
            assert!(len < 126, "a short control frame");
            if read.len() < at + 2 + len {
                break;
            }
            let payload = &read[at + 2..at + 2 + len];
            if opcode == 0x8 {
                assert!(payload.len() >= 2, "the close frame has no code: {payload:?}");
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                return (code, String::from_utf8_lossy(&payload[2..]).into_owned());
            }
            at += 2 + len;
        }
    }
}

fn config() -> String {
    config_toml(&[("a", "openai", "fast-stable")], "")
}

#[tokio::test]
async fn an_unmasked_client_frame_is_closed_with_1002_and_a_reason() {
    let server = start(&config()).await;
    let mut tcp = upgraded(server.addr).await;
    // FIN + text, no mask bit: clients must mask every frame.
    tcp.write_all(&[0x81, 0x02, b'h', b'i']).await.expect("frame written");
    let (code, reason) = close_frame(&mut tcp).await;
    assert_eq!(code, 1002, "protocol error: {reason}");
    assert!(!reason.is_empty(), "a short reason");
}

#[tokio::test]
async fn a_text_frame_that_is_not_utf8_is_closed_with_1007_and_a_reason() {
    let server = start(&config()).await;
    let mut tcp = upgraded(server.addr).await;
    let mask = [0x11, 0x22, 0x33, 0x44];
    let payload = [0xffu8, 0xfe];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&frame).await.expect("frame written");
    let (code, reason) = close_frame(&mut tcp).await;
    assert_eq!(code, 1007, "invalid frame payload data: {reason}");
    assert!(reason.contains("UTF-8"), "{reason}");
}
