//! The settings page (docs/SETTINGS.md) names every setting of `serve`: its flag and its
//! environment variable, so that an operator reading it misses none. Hidden arguments are
//! the reference's variables Tollgate refuses; docs/MIGRATING.md lists those.

use clap::CommandFactory as _;

use super::{Cli, all_args};

/// The page, as built into the test.
const PAGE: &str = include_str!("../../../docs/SETTINGS.md");

#[test]
fn the_settings_page_names_every_flag_and_variable_of_serve() {
    let command = Cli::command();
    let serve = command
        .find_subcommand("serve")
        .expect("a serve subcommand");
    let mut missing = Vec::new();
    for arg in all_args(serve) {
        let Some(long) = arg.get_long().filter(|_| !arg.is_hide_set()) else {
            continue;
        };
        let flag = format!("`--{long}`");
        if !PAGE.contains(&flag) {
            missing.push(flag);
        }
        if let Some(env) = arg.get_env().and_then(|e| e.to_str()) {
            let env = format!("`{env}`");
            if !PAGE.contains(&env) {
                missing.push(env);
            }
        }
    }
    assert!(missing.is_empty(), "docs/SETTINGS.md lacks {missing:?}");
}
