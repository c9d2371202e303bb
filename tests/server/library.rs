//! The library's own contract: `tollgate::run` serves on the listeners it is given and
//! returns once its shutdown completes.

use std::net::TcpListener;
use std::time::Duration;

use tollgate::{Config, Listeners};
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::loopback;
use tollgate_testkit::tollgate::{ConfigDir, Listening};

const RULES: &str = "domain: lib\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
/// How long `run` may take to return after its shutdown, with no call in flight.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_the_listeners_given_and_returns_after_the_shutdown() {
    let config_dir = ConfigDir::with_file("rules.yaml", RULES);
    let path = config_dir.file("rules.yaml");
    let args = ["--config", path.to_str().expect("a UTF-8 path")];
    let config = Config::from_command_line(&args, &[("DEBUG_PORT", "off")])
        .await
        .expect("the settings are valid");
    let (grpc, http) = (bind(), bind());
    let addrs = Listening {
        grpc: grpc.local_addr().expect("an address"),
        http: http.local_addr().expect("an address"),
    };
    let (shutdown, shut) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(tollgate::run(
        config,
        Listeners::Bound { grpc, http },
        async {
            let _ = shut.await;
        },
    ));
    {
        let mut rls = addrs.client().await;
        assert_eq!(code(&rls.check("lib", &[("user", "ann")]).await), Code::Ok);
        assert_eq!(
            code(&rls.check("lib", &[("user", "ann")]).await),
            Code::OverLimit
        );
        assert_eq!(addrs.get("/healthcheck").await.status, 200);
    }
    shutdown.send(()).expect("run still waits for its shutdown");
    let returned = tokio::time::timeout(STOP_TIMEOUT, served)
        .await
        .expect("run returns after its shutdown")
        .expect("run does not panic");
    assert!(returned.is_ok(), "{returned:?}");
}

fn bind() -> TcpListener {
    TcpListener::bind(loopback(0)).expect("bind a loopback listener")
}
