//! Announcements forged with `NOTIFY` on the channel of the instances sharing a
//! PostgreSQL: nothing is believed past what an instance could have meant
//! ([`tollgate_testkit::forged`]). NOTIFY takes under 8,000 bytes, so an oversized
//! snapshot is one of too many lines.

use std::cell::RefCell;

use tollgate_testkit::forged::{
    POSTGRES_CHANNEL, a_decrease_stamped_far_ahead_is_ignored, forged_top_keys_are_not_believed,
    oversized_by_lines,
};
use tollgate_testkit::postgres::PostgresServer;

use crate::support::{DOMAIN, connected};

/// `pg_notify` on the instances' channel, the text dollar-quoted as it is.
fn notify(postgres: &PostgresServer, text: &str) {
    assert!(!text.contains("$forged$"), "{text:?} ends its own quoting");
    postgres.psql(&format!(
        "SELECT pg_notify('{POSTGRES_CHANNEL}', $forged${text}$forged$)"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_stamped_far_ahead_of_postgres_is_ignored() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &[]).await;
    // Published to, then stopped: never both at once.
    let postgres = RefCell::new(postgres);
    let publish = |text: &str| notify(&postgres.borrow(), text);
    let mut stop = || postgres.borrow_mut().stop();
    a_decrease_stamped_far_ahead_is_ignored(&server, DOMAIN, &publish, &mut stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_top_keys_on_postgres_are_not_believed() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &[]).await;
    let publish = |text: &str| notify(&postgres, text);
    forged_top_keys_are_not_believed(&server, DOMAIN, &publish, &[oversized_by_lines(DOMAIN)])
        .await;
}
