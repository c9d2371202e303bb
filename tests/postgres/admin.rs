//! A reset through one of two Tollgates on one real PostgreSQL server reaches the other's
//! local view (LISTEN/NOTIFY), so the next request on both is admitted.

use tollgate_testkit::admin::{TOKEN, assert_reset_reaches_every_instance};
use tollgate_testkit::postgres::PostgresServer;

use crate::support::{DOMAIN, USER_LIMIT, serve};

#[tokio::test]
async fn a_reset_through_one_instance_admits_the_next_request_on_both() {
    let postgres = PostgresServer::start();
    let a = serve(&postgres, &[])
        .env("ADMIN_TOKEN", TOKEN)
        .start_connected()
        .await;
    let b = serve(&postgres, &[])
        .env("ADMIN_TOKEN", TOKEN)
        .start_connected()
        .await;
    assert_reset_reaches_every_instance(&a, &b, DOMAIN, ("user", "ann"), USER_LIMIT).await;
}
