//! Stop strings matched on streamed text. Text arrives a piece at a time; a stop string may span
//! pieces, so the end of the text that could still grow into a stop string is held back until the
//! next piece settles it. When a stop string is found, the text before it is released and nothing
//! after it.

/// What one piece of text released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopScan {
    /// Text that is safe to show: it cannot be part of a stop string.
    pub text: String,
    /// Whether a stop string was found; `text` then ends right before it.
    pub stopped: bool,
}

/// Watches streamed text for any of a set of stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopStringMatcher {
    stop_strings: Vec<String>,
    /// Received text not yet released: always a suffix that is a prefix of some stop string.
    held_back: String,
}

impl StopStringMatcher {
    /// Empty stop strings are ignored: they would stop before the first character.
    pub fn new(stop_strings: &[String]) -> Self {
        StopStringMatcher {
            stop_strings: stop_strings
                .iter()
                .filter(|stop| !stop.is_empty())
                .cloned()
                .collect(),
            held_back: String::new(),
        }
    }

    /// Takes the next piece of text and releases what is settled.
    pub fn push(&mut self, piece: &str) -> StopScan {
        if self.stop_strings.is_empty() {
            return StopScan {
                text: piece.to_owned(),
                stopped: false,
            };
        }
        // A stop string that began in text already released would have kept that text held back,
        // so every match begins inside `held_back + piece`.
        let mut pending = std::mem::take(&mut self.held_back);
        pending.push_str(piece);
        let earliest_stop = self
            .stop_strings
            .iter()
            .filter_map(|stop| pending.find(stop.as_str()))
            .min();
        if let Some(stop_start) = earliest_stop {
            pending.truncate(stop_start);
            return StopScan {
                text: pending,
                stopped: true,
            };
        }
        let held_len = self.longest_stop_prefix_suffix(&pending);
        self.held_back = pending.split_off(pending.len() - held_len);
        StopScan {
            text: pending,
            stopped: false,
        }
    }

    /// Releases the held-back text once generation has ended for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held_back)
    }

    /// Length in bytes of the longest suffix of `text` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self, text: &str) -> usize {
        self.stop_strings
            .iter()
            .filter_map(|stop| {
                let longest_candidate = (stop.len() - 1).min(text.len());
                (1..=longest_candidate).rev().find(|&len| {
                    let suffix_start = text.len() - len;
                    text.is_char_boundary(suffix_start)
                        && stop
                            .as_bytes()
                            .starts_with(&text.as_bytes()[suffix_start..])
                })
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopStringMatcher {
        let stops: Vec<String> = stops.iter().map(|stop| stop.to_string()).collect();
        StopStringMatcher::new(&stops)
    }

    /// Feeds the pieces and returns everything released and whether it stopped.
    fn stream(matcher: &mut StopStringMatcher, pieces: &[&str]) -> (String, bool) {
        let mut released = String::new();
        for piece in pieces {
            let scan = matcher.push(piece);
            released.push_str(&scan.text);
            if scan.stopped {
                return (released, true);
            }
        }
        released.push_str(&matcher.finish());
        (released, false)
    }

    #[test]
    fn no_stop_strings_passes_text_through() {
        let mut matcher = matcher(&[""]);
        assert_eq!(
            matcher.push("abc"),
            StopScan {
                text: "abc".into(),
                stopped: false
            }
        );
    }

    #[test]
    fn stop_inside_one_piece_keeps_text_before_it() {
        let mut matcher = matcher(&["STOP"]);
        assert_eq!(
            stream(&mut matcher, &["hello STOP world"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn stop_spanning_pieces_is_found_and_prefix_is_held_back() {
        let mut matcher = matcher(&["\n\nUser:"]);
        assert_eq!(
            matcher.push("Paris.\n"),
            StopScan {
                text: "Paris.".into(),
                stopped: false
            }
        );
        assert_eq!(matcher.push("\nUs").text, "");
        assert_eq!(
            matcher.push("er: more"),
            StopScan {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn held_back_text_is_released_when_it_stops_matching() {
        let mut matcher = matcher(&["###"]);
        assert_eq!(matcher.push("a #").text, "a ");
        assert_eq!(matcher.push("#").text, "");
        assert_eq!(matcher.push("b").text, "##b");
        assert_eq!(stream(&mut matcher, &["c #"]), ("c #".into(), false));
    }

    #[test]
    fn earliest_of_several_stop_strings_wins() {
        let mut matcher = matcher(&["world", "lo w"]);
        assert_eq!(
            stream(&mut matcher, &["hel", "lo world"]),
            ("hel".into(), true)
        );
    }

    #[test]
    fn overlapping_prefix_restarts_inside_held_text() {
        // "aab" must be found in "aaab" although the first "aa" turns out not to start it.
        let mut matcher = matcher(&["aab"]);
        assert_eq!(
            stream(&mut matcher, &["x", "a", "a", "a", "b", "y"]),
            ("xa".into(), true)
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let mut matcher = matcher(&["éé!"]);
        assert_eq!(matcher.push("café").text, "caf");
        assert_eq!(
            stream(&mut matcher, &["é!", "after"]),
            (String::new(), true)
        );
        let mut matcher = self::matcher(&["éé!"]);
        assert_eq!(
            stream(&mut matcher, &["café", "s"]),
            ("cafés".into(), false)
        );
    }
}
