//! Fuzzing without coverage instrumentation, on stable Rust: a target's seeds from
//! `fuzz/corpus/<target>/`, then mutations of them (`mutate.rs`). An input whose outcome
//! (a rough signature of the answer: which error, which status) is new joins the pool, so
//! the run reaches past the seeds. A panic or a broken invariant saves the input under
//! `fuzz/crashes/` and fails the test. The targets are the binary's (`src/fuzz.rs`): they
//! drive its request handlers in-process.
//!
//! Without settings a run is a short pass with a fixed seed, as the test suite runs it.
//! `FUZZ_SECONDS=N` runs for a time with a fresh seed, `FUZZ_SEED=N` replays a run, and
//! `FUZZ_ITERATIONS=N` runs a fixed number of mutations.

mod mutate;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::rng::Rng;
use mutate::mutate;

/// Mutations per target in the test suite, unless `FUZZ_SECONDS` or `FUZZ_ITERATIONS`.
const SUITE_ITERATIONS: u64 = 2_000;
/// The most inputs kept in the pool; past it, new ones replace random old ones.
const POOL: usize = 4_096;
/// The most outcomes remembered, so that a long run's memory stays bounded when answers
/// echo their input in ways a signature cannot fold; past it, no input is new.
const OUTCOMES: usize = 1 << 16;

/// How long a run lasts.
enum RunLength {
    Iterations(u64),
    Time(Duration),
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

/// The repository's `fuzz/` directory.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn corpus_dir(target: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target)
}

/// Runs `check` on the seeds of `target`, then on mutations, within the run length the
/// environment sets. `check` returns the outcome's signature, or the invariant it broke.
pub fn run(
    target: &str,
    dictionary: &[&[u8]],
    mut check: impl FnMut(&[u8]) -> Result<String, String>,
) {
    let (length, seed) = match (env_number("FUZZ_SECONDS"), env_number("FUZZ_ITERATIONS")) {
        (Some(secs), _) => (RunLength::Time(Duration::from_secs(secs)), None),
        (None, Some(n)) => (RunLength::Iterations(n), None),
        (None, None) => (RunLength::Iterations(SUITE_ITERATIONS), Some(0x5eed)),
    };
    let seed = env_number("FUZZ_SEED").or(seed).unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng::new(seed);
    let mut pool = seeds(target);
    assert!(
        !pool.is_empty(),
        "no seeds in {}",
        corpus_dir(target).display()
    );
    let mut outcomes = HashSet::new();
    let mut run_one = |input: &[u8], outcomes: &mut HashSet<String>| -> bool {
        let result = catch_unwind(AssertUnwindSafe(|| check(input)));
        let failure = match result {
            Ok(Ok(signature)) => return outcomes.len() < OUTCOMES && outcomes.insert(signature),
            Ok(Err(broken)) => broken,
            Err(panic) => panic_message(&*panic),
        };
        let saved = save_crash(target, input);
        panic!(
            "fuzz {target} (seed {seed}): {failure}; input saved as {}",
            saved.display()
        );
    };
    for input in pool.clone() {
        run_one(&input, &mut outcomes);
    }
    let started = Instant::now();
    let mut executions = 0u64;
    while match length {
        RunLength::Iterations(n) => executions < n,
        RunLength::Time(limit) => started.elapsed() < limit,
    } {
        let mut input = rng.pick(&pool).clone();
        let other = rng.pick(&pool).clone();
        mutate(&mut rng, &mut input, dictionary, &other);
        executions += 1;
        if run_one(&input, &mut outcomes) {
            if pool.len() < POOL {
                pool.push(input);
            } else {
                let i = rng.below(pool.len());
                pool[i] = input;
            }
        }
    }
    eprintln!(
        "fuzz {target}: {executions} executions in {:.1?} ({:.0}/s), {} outcomes, seed {seed}",
        started.elapsed(),
        executions as f64 / started.elapsed().as_secs_f64().max(1e-9),
        outcomes.len(),
    );
}

/// Every file of the target's corpus directory.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

fn save_crash(target: &str, input: &[u8]) -> PathBuf {
    let dir = fuzz_dir().join("crashes");
    // FNV-1a names the input after its contents, so one crash is saved once.
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{target}-{hash:016x}"));
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input));
    if let Err(e) = written {
        eprintln!("cannot save {}: {e}", path.display());
    }
    path
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned());
    format!("panicked: {}", text.unwrap_or_default())
}

/// The outcome's signature: `kind` and `text` without digits, without what they quote and
/// without paths into the input (`descriptors[0].valu`), so that numbers and echoed input
/// (an unknown field's name, say) do not make every answer new; at most 80 characters.
pub fn signature(kind: &str, text: &str) -> String {
    let mut quote = None;
    let mut plain = String::new();
    for word in format!("{kind}: {text}").split(' ') {
        if word.contains(['.', '[']) {
            continue;
        }
        plain.extend(word.chars().filter(|&c| match quote {
            Some(open) => {
                if c == open {
                    quote = None;
                }
                false
            }
            None if matches!(c, '`' | '"' | '\'') => {
                quote = Some(c);
                true
            }
            None => !c.is_ascii_digit(),
        }));
        plain.push(' ');
    }
    plain.chars().take(80).collect()
}
