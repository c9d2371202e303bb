//! Boolean settings as the reference reads them: `--name` alone, `--name=false`, or the
//! environment variable set to true/false, yes/no, on/off, 1/0; and the commands' switches,
//! whose value comes only after `=`.

use clap::builder::BoolishValueParser;
use clap::{Arg, ArgAction};

/// Makes an argument such a boolean; the derive calls it for `#[arg(…, flag())]`.
pub(super) trait Flag {
    /// This argument as a boolean that may stand alone or take a value.
    fn flag(self) -> Self;
    /// Such a boolean whose value comes only after `=` (`--tls=false`), so that the word
    /// after it is never taken for its value: `tollgate override --tls list`.
    fn switch(self) -> Self;
}

impl Flag for Arg {
    fn flag(self) -> Self {
        self.action(ArgAction::Set)
            .num_args(0..=1)
            .default_missing_value("true")
            .value_parser(BoolishValueParser::new())
    }

    fn switch(self) -> Self {
        self.flag().require_equals(true)
    }
}
