//! Two tailcut processes sharing one Redis: a stream started on one resumes on the other,
//! and both keep serving while Redis is down.

#[path = "support/redis.rs"]
mod redis_server;

use redis_server::RedisServer;

#[test]
fn the_test_redis_starts_is_killed_and_restarts_empty_on_its_port() {
    let mut redis = RedisServer::start();
    assert!(redis.answers());
    assert!(redis.command("SET k v").starts_with("+OK"));
    assert_eq!(redis.command("GET k"), "$1\r\nv\r\n");
    let port = redis.port();
    redis.kill();
    assert!(!redis.answers(), "killed");
    redis.restart();
    assert_eq!(redis.port(), port);
    assert!(redis.answers());
    assert_eq!(redis.command("GET k"), "$-1\r\n", "no persistence: a restart is empty");
}
