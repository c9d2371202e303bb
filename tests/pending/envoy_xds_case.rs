// From the xds branch: to be ported onto the testkit into tests/envoy/.

/// The rules can come over xDS instead of files: a management server pushes the example's
/// `/login` and `/static/*` rules (domain `edge`), and Envoy enforces them through
/// Tollgate as it does with the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_pushed_over_xds_are_enforced_through_envoy() {
    let path = |value: &str, rate_limit| RateLimitDescriptor {
        key: "path".into(),
        value: value.into(),
        rate_limit: Some(rate_limit),
        ..Default::default()
    };
    let login = RateLimitPolicy {
        unit: RateLimitUnit::Minute as i32,
        requests_per_unit: LOGIN_LIMIT as u32,
        ..Default::default()
    };
    let unlimited = RateLimitPolicy {
        unlimited: true,
        ..Default::default()
    };
    let xds = XdsServer::start().await;
    xds.set(
        "default",
        "1",
        vec![resource(RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![path("/login", login), path("/static/*", unlimited)],
        })],
    );
    let mut cmd = common::tollgate();
    cmd.args([
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ])
    .envs(xds.client_env("default"));
    let tollgate =
        tokio::task::spawn_blocking(move || Server::spawn(cmd).unwrap_or_else(|exit| exit.fail()))
            .await
            .expect("start tollgate");
    xds.wait_ack("default", "1").await;
    let upstream = Upstream::start().await;
    let envoy = start_envoy(&upstream, tollgate.grpc_addr(), false).await;

    for i in 0..LOGIN_LIMIT {
        let t = timed_get(&envoy, &upstream, "/login", None).await;
        assert_admitted(&t, i as usize + 1);
        assert_ratelimit_headers(&t, LOGIN_LIMIT, "5;w=60", LOGIN_LIMIT - 1 - i, 1..=66);
    }
    let t = timed_get(&envoy, &upstream, "/login", None).await;
    assert_limited(&t, LOGIN_LIMIT as usize);
    for i in 0..LOGIN_LIMIT + 2 {
        let t = timed_get(&envoy, &upstream, &format!("/static/{i}.css"), None).await;
        assert_admitted(&t, LOGIN_LIMIT as usize + i as usize + 1);
        assert_eq!(
            t.resp.header("x-ratelimit-limit"),
            None,
            "nothing limits /static/*: {t:#?}"
        );
    }
}
