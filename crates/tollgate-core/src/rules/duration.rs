//! Durations as rules write them: a whole number and a unit, `500ms`, `60s`, `2m`, `1h`.

use std::time::Duration;

/// `text` as a duration, or the problem in a rules author's words.
pub(super) fn parse_expire_after(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("'{text}' is not a duration like 500ms, 60s, 2m or 1h");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(invalid()),
    };
    number
        .checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("'{text}' is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_with_a_unit_are_durations() {
        assert_eq!(parse_expire_after("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_expire_after("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_expire_after(" 2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_expire_after("1h"), Ok(Duration::from_secs(3_600)));
        for bad in ["", "60", "s", "1.5s", "-1s", "10 s", "3d"] {
            assert!(parse_expire_after(bad).is_err(), "{bad}");
        }
        assert!(parse_expire_after("99999999999999999999h").is_err());
    }
}
