//! Secrets kept out of everything Tollgate prints (help, errors, logs, `/rlconfig`,
//! explain): the password of a URL becomes `***`, and settings that hold a secret are
//! never shown whole.

/// What a password is shown as.
const HIDDEN: &str = "***";

/// `text` with the password of every URL in it hidden: `redis://user:pw@host:6379`
/// becomes `redis://user:***@host:6379`, `redis://:pw@h:1` `redis://:***@h:1`. Lists
/// (`a:1,redis://:pw@b:2`) are redacted URL by URL; a login without a password, and text
/// that is no URL, stay as they are.
pub fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let (before, after) = rest.split_at(scheme_end + 3);
        out.push_str(before);
        // A login ends at the last `@` of its list item: a password may hold `/` or `@`.
        let item_end = after.find([',', ' ']).unwrap_or(after.len());
        let (item, next) = after.split_at(item_end);
        match item.rfind('@') {
            Some(at) => {
                let login = &item[..at];
                match login.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(HIDDEN);
                    }
                    None => out.push_str(login),
                }
                out.push_str(&item[at..]);
            }
            None => out.push_str(item),
        }
        rest = next;
    }
    out.push_str(rest);
    out
}

/// The address of a URL: what follows its scheme and login, up to its path
/// (`redis://:pw@h:6379/0` gives `h:6379`); a bare `host:port` is its own address.
pub fn address(url: &str) -> &str {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let after_login = after_scheme
        .rsplit_once('@')
        .map_or(after_scheme, |(_, host)| host);
    let end = after_login
        .find(['/', '?', '#'])
        .unwrap_or(after_login.len());
    &after_login[..end]
}

/// Whether the setting (an environment variable's name) may hold a secret: a password,
/// a token, a URL with a login, headers that may carry a credential.
pub fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ["AUTH", "TOKEN", "PASSWORD", "SECRET"]
        .iter()
        .any(|word| name.contains(word))
        || name.ends_with("_URL")
        || name.ends_with("_HEADERS")
}

/// A setting's value as it may be printed: a URL with its password hidden, any other
/// secret hidden whole.
pub fn setting(name: &str, value: &str) -> String {
    match is_secret(name) {
        true if name.to_ascii_uppercase().ends_with("_URL") => url(value),
        true => HIDDEN.to_owned(),
        false => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_of_urls_are_hidden() {
        assert_eq!(url("redis://:pw@host:6379"), "redis://:***@host:6379");
        assert_eq!(
            url("postgres://tollgate:s3cret@db:5432/limits?sslmode=require"),
            "postgres://tollgate:***@db:5432/limits?sslmode=require"
        );
        assert_eq!(url("redis://:p@ss/w@h:1"), "redis://:***@h:1");
        assert_eq!(
            url("mymaster,redis://:a@s1:26379, rediss://u:b@s2:26379"),
            "mymaster,redis://:***@s1:26379, rediss://u:***@s2:26379"
        );
        assert_eq!(url("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(url("localhost:6379"), "localhost:6379");
        assert_eq!(url(""), "");
    }

    #[test]
    fn an_address_is_host_and_port() {
        assert_eq!(address("redis://:pw@h:6379/0"), "h:6379");
        assert_eq!(address("rediss://h:1"), "h:1");
        assert_eq!(address("h:1"), "h:1");
        assert_eq!(address("postgres://u:p@db:5432/x?a=b"), "db:5432");
    }

    #[test]
    fn secret_settings_are_hidden() {
        for name in [
            "REDIS_URL",
            "REDIS_AUTH",
            "REDIS_SENTINEL_AUTH",
            "POSTGRES_URL",
            "ADMIN_TOKEN",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        ] {
            assert!(is_secret(name), "{name}");
        }
        assert!(!is_secret("GRPC_UDS"));
        assert_eq!(setting("REDIS_SENTINEL_AUTH", "pw"), "***");
        assert_eq!(setting("REDIS_URL", "redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(setting("GRPC_UDS", "/tmp/rl.sock"), "/tmp/rl.sock");
    }
}
