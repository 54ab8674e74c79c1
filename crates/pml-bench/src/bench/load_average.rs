//! The machine's load averages, recorded around `pml bench cache --peer`'s rounds: a busy machine
//! slows either engine, and the figures show when one did.

/// The three load averages of `/proc/loadavg` (what `uptime` prints).
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

/// The machine's load averages now; zeros where /proc does not say.
pub fn load_average() -> [f64; 3] {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| parse_loadavg(&text))
        .unwrap_or([0.0; 3])
}

/// The three load averages as `uptime` prints them.
pub fn format_load(load: [f64; 3]) -> String {
    format!("{:.2}, {:.2}, {:.2}", load[0], load[1], load[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_averages_come_from_the_first_three_fields() {
        assert_eq!(
            parse_loadavg("4.12 3.05 1.99 3/512 12345\n"),
            Some([4.12, 3.05, 1.99])
        );
        assert_eq!(parse_loadavg("4.12 x 1.99"), None);
        assert_eq!(parse_loadavg(""), None);
    }
}
