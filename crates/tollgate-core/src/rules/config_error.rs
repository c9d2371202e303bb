//! What is wrong with rules, where: each problem and every problem of one load.

use std::fmt;

/// One problem in the rules: where they came from (a file, an xDS resource), the place in
/// them, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file path, or the name of the resource that carried the rules.
    pub origin: String,
    /// Like `descriptors[0].rate_limit.unit`; empty for the whole origin.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn whole(origin: &str, message: String) -> Self {
        Self {
            origin: origin.to_owned(),
            path: String::new(),
            message,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(f, "{}: {}: {}", self.origin, self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one load, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
