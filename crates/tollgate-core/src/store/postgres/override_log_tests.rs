//! `overrides.sql` on a real PostgreSQL: a change made around its functions (by a
//! Tollgate of schema version 9, or by hand) is logged, counted once and announced; a
//! change past its deadline or the maximum changes nothing; expired overrides are purged
//! by a read of the log and free their places.

use tokio_postgres::Client;

use super::differential::{fresh_schema, runtime};

const CHANGE: &str = "SELECT tollgate_override_change('p', $1, $2, $3, $4, 'ch')";

async fn change(
    client: &Client,
    id: &str,
    spec: Option<&str>,
    max: i64,
    deadline: i64,
) -> Vec<Option<String>> {
    client
        .query_one(CHANGE, &[&id, &spec, &max, &deadline])
        .await
        .expect("change")
        .get(0)
}

/// The log of prefix `p` after `since`: version and (id, JSON) per change.
async fn log(client: &Client, since: i64) -> (i64, Vec<(String, Option<String>)>) {
    let row = client
        .query_one(
            "SELECT * FROM tollgate_override_log('p', $1, 100)",
            &[&since],
        )
        .await
        .expect("log");
    let ids: Vec<String> = row.get("ids");
    let specs: Vec<Option<String>> = row.get("specs");
    (row.get("version"), ids.into_iter().zip(specs).collect())
}

async fn live(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT live FROM tollgate_override_meta WHERE prefix = 'p'",
            &[],
        )
        .await
        .expect("meta")
        .get(0)
}

/// Far in the future, in µs.
const LATER: i64 = i64::MAX;

#[test]
fn changes_made_around_the_functions_are_logged_and_counted_once() {
    runtime().block_on(async {
        let client = fresh_schema("override_log_around").await;
        // As version 9 writes: an upsert, then the same again replacing it.
        let upsert = "INSERT INTO tollgate_overrides (prefix, id, spec) VALUES ('p', $1, $2) \
                      ON CONFLICT (prefix, id) DO UPDATE SET spec = excluded.spec";
        for (id, spec) in [
            ("a", r#"{"expires_at":4102444800}"#),
            ("a", "{}"),
            ("b", "{}"),
        ] {
            client.execute(upsert, &[&id, &spec]).await.expect("upsert");
        }
        assert_eq!(live(&client).await, 2, "a replacement counted once");
        let (version, changed) = log(&client, 0).await;
        assert_eq!(
            changed,
            vec![
                ("a".to_owned(), Some("{}".to_owned())),
                ("b".to_owned(), Some("{}".to_owned()))
            ]
        );
        client
            .execute("DELETE FROM tollgate_overrides WHERE id = 'a'", &[])
            .await
            .expect("delete");
        assert_eq!(live(&client).await, 1);
        let (after, changed) = log(&client, version).await;
        assert!(after > version);
        assert_eq!(changed, vec![("a".to_owned(), None)], "a tombstone");
    });
}

#[test]
fn a_change_past_its_deadline_or_the_maximum_changes_nothing() {
    runtime().block_on(async {
        let client = fresh_schema("override_log_refused").await;
        assert_eq!(
            change(&client, "a", Some("{}"), 5, 1).await,
            vec![Some("late".to_owned())]
        );
        assert_eq!(live(&client).await, 0);
        assert_eq!(
            change(&client, "a", Some("{}"), 1, LATER).await,
            vec![Some("set".to_owned()), None]
        );
        assert_eq!(
            change(&client, "b", Some("{}"), 1, LATER).await,
            vec![Some("full".to_owned()), Some("1".to_owned())]
        );
        assert_eq!(
            change(&client, "a", Some(r#"{"x":1}"#), 1, LATER).await,
            vec![Some("set".to_owned()), Some("{}".to_owned())],
            "a replacement adds none"
        );
        assert_eq!(
            change(&client, "a", None, 1, LATER).await,
            vec![Some("deleted".to_owned()), Some(r#"{"x":1}"#.to_owned())]
        );
        assert_eq!(live(&client).await, 0);
    });
}

#[test]
fn expired_overrides_are_purged_and_free_their_places() {
    runtime().block_on(async {
        let client = fresh_schema("override_log_expiry").await;
        let past = r#"{"expires_at":1}"#;
        client
            .execute(
                "INSERT INTO tollgate_overrides (prefix, id, spec) VALUES ('p', 'old', $1)",
                &[&past],
            )
            .await
            .expect("insert");
        assert_eq!(
            change(&client, "new", Some("{}"), 1, LATER).await,
            vec![Some("set".to_owned()), None],
            "the expired one's place is free"
        );
        let (_, changed) = log(&client, 0).await;
        assert!(changed.contains(&("old".to_owned(), None)), "{changed:?}");
        let left: i64 = client
            .query_one("SELECT count(*) FROM tollgate_overrides", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(left, 1);
    });
}
