//! What the container image provides, read from the repository's Dockerfile: the
//! entrypoint and its arguments, and where the image reads rules.

use std::path::Path;

/// The Dockerfile's final stage, as far as the chart depends on it.
pub(crate) struct Image {
    /// `ENTRYPOINT [...]`.
    pub(crate) entrypoint: Vec<String>,
    /// `CMD [...]`: the arguments a container without `args` runs with.
    pub(crate) cmd: Vec<String>,
    /// The directory the example rules are copied into: where the image reads rules.
    pub(crate) rules_dir: String,
}

impl Image {
    pub(crate) fn read() -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let rules_file = instruction(&text, "COPY config/example.yaml ");
        let rules_dir = Path::new(rules_file.trim())
            .parent()
            .and_then(Path::to_str)
            .unwrap_or_else(|| panic!("no directory in `COPY config/example.yaml {rules_file}`"))
            .to_owned();
        Self {
            entrypoint: exec_form(&instruction(&text, "ENTRYPOINT ")),
            cmd: exec_form(&instruction(&text, "CMD ")),
            rules_dir,
        }
    }
}

/// The rest of the last line starting with `prefix` (the final stage's, as later stages
/// come later).
fn instruction(dockerfile: &str, prefix: &str) -> String {
    dockerfile
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("the Dockerfile has no `{prefix}` line"))
        .to_owned()
}

/// An exec-form (JSON array) instruction's words.
fn exec_form(json: &str) -> Vec<String> {
    serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("`{json}` is not an exec-form JSON array: {e}"))
}
