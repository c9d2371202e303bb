//! Byte-level mutations in the manner of AFL's "havoc" stage: bit flips, interesting
//! bytes and numbers, dictionary tokens, deletions, duplications and splices, stacked.

use crate::rng::Rng;

/// The largest input the mutator makes; larger ones are cut.
const MAX_LEN: usize = 64 << 10;

const INTERESTING_BYTES: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'\n', b'\r', b'\t', b' ', b':', b'-', b'"', b'\'', b'\\', b'{', b'}',
    b'[', b']', b'*', b'&', b'!', b'|', b'=', b'#', b'%', b',',
];

const INTERESTING_NUMBERS: &[&[u8]] = &[
    b"0",
    b"-1",
    b"1",
    b"2147483647",
    b"2147483648",
    b"4294967295",
    b"4294967296",
    b"-9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"1e309",
    b"0.5",
    b"NaN",
    b".inf",
];

/// Changes `input` by one to four stacked mutations; `dictionary` holds the target's
/// tokens and `other` is a second input to splice from.
pub(super) fn mutate(rng: &mut Rng, input: &mut Vec<u8>, dictionary: &[&[u8]], other: &[u8]) {
    for _ in 0..=rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(9) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = *rng.pick(INTERESTING_BYTES);
            }
            2 | 3 if !dictionary.is_empty() => {
                let token = rng.pick(dictionary);
                input.splice(at..at, token.iter().copied());
            }
            4 if !input.is_empty() => {
                let from = rng.below(input.len());
                let len = 1 + rng.below((input.len() - from).min(16));
                input.drain(from..from + len);
            }
            5 if !input.is_empty() => {
                let from = rng.below(input.len());
                let len = 1 + rng.below((input.len() - from).min(64));
                let copy = input[from..from + len].to_vec();
                input.splice(at..at, copy);
            }
            6 if !other.is_empty() => {
                let from = rng.below(other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            7 => {
                let digits = input.iter().position(u8::is_ascii_digit);
                let from = digits.unwrap_or(at);
                let end = input[from..]
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .map_or(input.len(), |n| from + n);
                input.splice(from..end, rng.pick(INTERESTING_NUMBERS).iter().copied());
            }
            _ => {
                let byte = rng.next_u64() as u8;
                input.insert(at, byte);
            }
        }
        input.truncate(MAX_LEN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_in_bounds_on_any_input() {
        let mut rng = Rng::new(7);
        let dictionary: &[&[u8]] = &[b"domain:", b"*a"];
        for len in 0..40 {
            let mut input = vec![b'9'; len];
            for _ in 0..200 {
                mutate(&mut rng, &mut input, dictionary, b"other");
                assert!(input.len() <= MAX_LEN);
            }
        }
    }
}
