//! One scenario, two servers: a test of it on Redis and one on Valkey.

/// Tests `scenario(engine)` on each engine, as `scenario::redis` and `scenario::valkey`
/// (`cargo test --test redis valkey` runs the Valkey half). The test attribute is
/// `#[tokio::test]` unless given, e.g. `tokio::test(flavor = "multi_thread")`.
macro_rules! on_each_engine {
    ($scenario:ident) => {
        on_each_engine!($scenario, tokio::test);
    };
    ($scenario:ident, $test:meta) => {
        mod $scenario {
            use tollgate_testkit::redis::Engine;

            #[$test]
            async fn redis() {
                super::$scenario(Engine::Redis).await;
            }

            #[$test]
            async fn valkey() {
                super::$scenario(Engine::Valkey).await;
            }
        }
    };
}
