//! The Valkey the suites run: the pinned release, speaking as Valkey. The Redis scenarios
//! that run on Valkey too are the ones marked `on_each_engine!` in the other files.

use tollgate_testkit::redis::{Engine, RedisServer};

#[test]
fn the_valkey_under_test_is_the_pinned_release() {
    let valkey = RedisServer::start_engine(Engine::Valkey);
    let version = valkey
        .info_field("server", "valkey_version")
        .expect("a Valkey server reports valkey_version");
    assert!(version.starts_with("8.1."), "Valkey {version}");
    assert_eq!(
        valkey.info_field("server", "server_name").as_deref(),
        Some("valkey")
    );
}
