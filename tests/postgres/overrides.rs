//! Runtime overrides kept in PostgreSQL: set through one instance and enforced by
//! another, kept across restarts, deleted through one.

use tollgate_testkit::admin::TOKEN;
use tollgate_testkit::overrides::assert_overrides_spread;
use tollgate_testkit::postgres::PostgresServer;

use crate::support::{DOMAIN, USER_LIMIT, serve};

#[tokio::test]
async fn an_override_set_on_one_instance_is_enforced_by_the_other_and_kept() {
    let postgres = PostgresServer::start();
    let limit = u32::try_from(USER_LIMIT).expect("a small limit");
    let start = async || {
        serve(&postgres, &[])
            .env("ADMIN_TOKEN", TOKEN)
            .start_connected()
            .await
    };
    assert_overrides_spread(start, DOMAIN, ("user", "ann"), limit).await;
}
