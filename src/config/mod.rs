//! Rules: the reference's YAML format, validated and compiled into matchable [`Rules`].

mod compile;
mod display;
mod load;
mod pattern;
mod rules;
mod spec;
mod watch;

pub use compile::metric_labels;
pub use rules::{Domain, Policy, Rule, Rules};
pub use watch::{RulesWatch, watch};

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::limiter::Algorithm;
use crate::metrics::DescriptorFamilies;

/// Settings-level defaults for what a rule leaves out.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub algorithm: Algorithm,
    pub precision: u32,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::SlidingWindow,
            precision: 10,
        }
    }
}

/// One problem in the rules: the file, the place in it, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Like `descriptors[0].rate_limit.unit`; empty for the file as a whole.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    fn file(file: &Path, message: String) -> Self {
        Self {
            file: file.to_owned(),
            path: String::new(),
            message,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}: {}: {}",
                self.file.display(),
                self.path,
                self.message
            )
        }
    }
}

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

/// Loads the rules at `path` (a file or a directory), reporting every problem found.
pub fn load(
    path: &Path,
    defaults: Defaults,
    families: &DescriptorFamilies,
) -> Result<Rules, ConfigErrors> {
    let files = load::rule_files(path).map_err(|e| ConfigErrors(vec![e]))?;
    let mut builder = Builder::new(defaults, families);
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => builder.add(&file, &text),
            Err(e) => builder
                .errors
                .push(ConfigError::file(&file, format!("cannot read: {e}"))),
        }
    }
    builder.finish()
}

/// Compiles rules from YAML text, as if read from a file called `name`.
pub fn parse_str(name: &str, text: &str, defaults: Defaults) -> Result<Rules, ConfigErrors> {
    parse_str_into(name, text, defaults, &DescriptorFamilies::default())
}

/// Like [`parse_str`], with the rules' metric handles in `families`.
pub fn parse_str_into(
    name: &str,
    text: &str,
    defaults: Defaults,
    families: &DescriptorFamilies,
) -> Result<Rules, ConfigErrors> {
    let mut builder = Builder::new(defaults, families);
    builder.add(Path::new(name), text);
    builder.finish()
}

/// Rules being assembled from files, with the problems found so far.
struct Builder<'a> {
    defaults: Defaults,
    families: &'a DescriptorFamilies,
    rules: Rules,
    errors: Vec<ConfigError>,
    /// The file each domain came from, to name both files of a duplicate.
    seen: HashMap<String, PathBuf>,
}

impl<'a> Builder<'a> {
    fn new(defaults: Defaults, families: &'a DescriptorFamilies) -> Self {
        Self {
            defaults,
            families,
            rules: Rules::default(),
            errors: Vec::new(),
            seen: HashMap::new(),
        }
    }

    fn add(&mut self, file: &Path, text: &str) {
        let spec = match load::parse(file, text) {
            Ok(spec) => spec,
            Err(e) => return self.errors.push(e),
        };
        let name = spec.domain.clone();
        if let Some(first) = self.seen.get(&name) {
            let message = format!("duplicate domain '{name}' (also in {})", first.display());
            return self.errors.push(ConfigError {
                file: file.to_owned(),
                path: "domain".into(),
                message,
            });
        }
        self.seen.insert(name.clone(), file.to_owned());
        if let Some(domain) =
            compile::compile(file, spec, self.defaults, self.families, &mut self.errors)
        {
            self.rules.domains.insert(name, domain);
        }
    }

    fn finish(self) -> Result<Rules, ConfigErrors> {
        if self.errors.is_empty() {
            Ok(self.rules)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

#[cfg(test)]
mod tests;
