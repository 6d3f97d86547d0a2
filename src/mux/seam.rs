//! The seam: how a new attempt's text is joined to what the client already holds after a
//! mid-stream failure, so that the client ends with one coherent answer or an honest error.
//!
//! # The contract
//! The mux knows exactly what the client holds (the transcript). What the client ends with
//! is one of:
//! - the sent prefix plus what the continuation route generated after it (nothing the
//!   continuation generated is dropped; whitespace an adapter had to strip from the prefill
//!   is not sent twice);
//! - after a `reset` (native clients), the new route's answer;
//! - for a restart a client cannot be told about, the new answer when it repeats the sent
//!   text exactly (the repeat is swallowed), else an honest error;
//! - never a silently wrong text.
//!
//! # Verifying a continuation
//! A continuation request ends with the partial answer as the final assistant message, but an
//! upstream may ignore it and start over (a proxy in between, a template change, OpenAI's own
//! API). So the continuation's first bytes are compared with the client's text from its
//! start, and held while they repeat it:
//! - they differ at the first byte (continuations start with a space, punctuation or the
//!   rest of a word; answers start with their first word): a continuation. The whitespace the
//!   adapter stripped from the prefill is dropped from its start when the continuation
//!   re-emits it (over as many pieces as it takes: `Seam::Trim`), and everything else is sent;
//! - they repeat *all* of the client's text: the upstream started over and reproduced the
//!   answer; the repeat is swallowed and what follows is sent (`RestartMatched`);
//! - they repeat some of it and then differ: either a restart with a different answer or a
//!   continuation that happens to begin like the answer. Text cannot tell which, and either
//!   guess can be wrong, so neither is sent: the continuation is dropped and the mux restarts
//!   (`SeamOut::StartOver`), which is unambiguous (a matching restart is swallowed, a
//!   different one is a reset or an honest error).
//!
//! # Known limits
//! Text alone cannot tell two cases apart, and they are decided as follows:
//! - an upstream that ignores the prefill and writes a different answer whose very first
//!   character differs from the original's looks exactly like a continuation and is sent as
//!   one;
//! - a genuine continuation that begins with the *whole* of the client's text (the answer
//!   repeats itself exactly at the cut: "No. No." cut after "No. ") is taken for a matching
//!   restart, and the client ends with the answer missing that one repeat.
//!
//! Nothing here trims "overlap" at the seam: a continuation that repeats the last words on
//! purpose ("The very" + " very old") is real text and is kept.

/// How new text is joined to what the client already has.
#[derive(Debug, Clone)]
pub enum Seam {
    /// Forward everything.
    Pass,
    /// A restart the client cannot be told about: drop new text while it repeats `expected`.
    Swallow { expected: String, matched: usize },
    /// A continuation, held until it is known not to be a restart of `partial`.
    Verify {
        /// What the client holds.
        partial: String,
        /// The part of `partial` the route was not sent (whitespace its convention strips).
        withheld: String,
        /// Continuation text not yet judged.
        held: String,
    },
    /// A continuation whose re-emission of the withheld whitespace went only part of the way
    /// in what came so far: `rest`, the part still to come, is dropped from the next text.
    Trim { rest: String },
}

/// What to do with one piece of new text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeamOut {
    Emit(String),
    Hold,
    /// The new text is a different answer from the one the client holds. `replay` is that
    /// answer's text so far, for a client that can be told to reset.
    Diverged {
        replay: String,
    },
    /// The continuation cannot be told from a restart: drop it and restart instead.
    StartOver,
}

/// What a judged continuation turned out to be (decision record, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeamVerdict {
    /// A real continuation.
    Continued,
    /// The upstream started over and reproduced the answer: the repeat was swallowed.
    RestartMatched,
    /// It repeated the start of the answer and then differed: dropped for a restart.
    Ambiguous,
}

impl SeamVerdict {
    pub fn metric_label(self) -> &'static str {
        match self {
            SeamVerdict::Continued => "continued",
            SeamVerdict::RestartMatched => "restart_matched",
            SeamVerdict::Ambiguous => "ambiguous",
        }
    }
}

impl Seam {
    pub fn swallow(expected: &str) -> Seam {
        Seam::Swallow {
            expected: expected.to_string(),
            matched: 0,
        }
    }

    /// A continuation of `partial`, whose route was sent all of it but `withheld` (a suffix).
    pub fn verify(partial: &str, withheld: &str) -> Seam {
        if partial.is_empty() {
            return Seam::Pass;
        }
        Seam::Verify {
            partial: partial.to_string(),
            withheld: withheld.to_string(),
            held: String::new(),
        }
    }

    pub fn is_pass(&self) -> bool {
        matches!(self, Seam::Pass)
    }

    /// Feeds one piece of new text.
    /// [`Seam::feed`] for text the caller owns: passed through without a copy when the seam
    /// only passes (every event of a first attempt).
    pub fn feed_owned(&mut self, text: String) -> (SeamOut, Option<SeamVerdict>) {
        match self {
            Seam::Pass => (SeamOut::Emit(text), None),
            _ => self.feed(&text),
        }
    }

    pub fn feed(&mut self, text: &str) -> (SeamOut, Option<SeamVerdict>) {
        match self {
            Seam::Pass => (SeamOut::Emit(text.to_string()), None),
            Seam::Swallow { expected, matched } => {
                let out = swallow(expected, matched, text);
                if matches!(out, SeamOut::Emit(_)) || *matched == expected.len() {
                    *self = Seam::Pass;
                }
                (out, None)
            }
            Seam::Verify { held, .. } => {
                held.push_str(text);
                self.judge(false)
            }
            Seam::Trim { rest } => {
                let out = trim(rest, text);
                if !rest.is_empty() && out.is_empty() {
                    // All of it was more of the whitespace; the rest may still come.
                    return (SeamOut::Emit(out), None);
                }
                *self = Seam::Pass;
                (SeamOut::Emit(out), None)
            }
        }
    }

    /// The answer ended: release held text, or report that the new answer fell short of or
    /// differs from what the client has.
    pub fn finish(&mut self) -> (SeamOut, Option<SeamVerdict>) {
        match self {
            Seam::Pass | Seam::Trim { .. } => (SeamOut::Hold, None),
            Seam::Swallow { expected, matched } => {
                let replay = expected[..*matched].to_string();
                *self = Seam::Pass;
                (SeamOut::Diverged { replay }, None)
            }
            Seam::Verify { .. } => self.judge(true),
        }
    }

    fn judge(&mut self, ended: bool) -> (SeamOut, Option<SeamVerdict>) {
        let Seam::Verify {
            partial,
            withheld,
            held,
        } = self
        else {
            return (SeamOut::Hold, None);
        };
        let k = common_prefix(held, partial);
        if k == partial.len() {
            // Started over and reproduced everything the client has: swallow the repeat.
            let rest = held[k..].to_string();
            *self = Seam::Pass;
            return (SeamOut::Emit(rest), Some(SeamVerdict::RestartMatched));
        }
        if k == held.len() && !ended {
            return (SeamOut::Hold, None);
        }
        if k > 0 {
            *self = Seam::Pass;
            return (SeamOut::StartOver, Some(SeamVerdict::Ambiguous));
        }
        // A continuation: drop its re-emission of the whitespace the prefill lost, which may
        // go on in the next text ("\n" then "\nThe" for a withheld "\n\n").
        let mut rest = std::mem::take(withheld);
        let out = trim(&mut rest, held);
        *self = if out.is_empty() && !rest.is_empty() {
            Seam::Trim { rest }
        } else {
            Seam::Pass
        };
        (SeamOut::Emit(out), Some(SeamVerdict::Continued))
    }
}

/// `text` without its start that re-emits the start of `rest` (withheld whitespace still to
/// come); `rest` keeps what of it `text` did not reach.
fn trim(rest: &mut String, text: &str) -> String {
    let skip = common_prefix(text, rest);
    if skip < text.len() {
        // The re-emission ended inside `text` (or never began): no more of it comes.
        rest.clear();
    } else {
        rest.drain(..skip);
    }
    text[skip..].to_string()
}

fn swallow(expected: &str, matched: &mut usize, text: &str) -> SeamOut {
    let rest = &expected[*matched..];
    if let Some(tail) = rest.strip_prefix(text) {
        *matched = expected.len() - tail.len();
        SeamOut::Hold
    } else if let Some(extra) = text.strip_prefix(rest) {
        *matched = expected.len();
        SeamOut::Emit(extra.to_string())
    } else {
        SeamOut::Diverged {
            replay: format!("{}{text}", &expected[..*matched]),
        }
    }
}

/// Bytes both strings start with, at a char boundary of both.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` then finishes; returns what was emitted, or `Err(replay)` on divergence.
    fn run(mut seam: Seam, pieces: &[&str]) -> Result<String, String> {
        let mut out = String::new();
        for p in pieces {
            match seam.feed(p).0 {
                SeamOut::Emit(s) => out.push_str(&s),
                SeamOut::Hold => {}
                SeamOut::Diverged { replay } => return Err(replay),
                SeamOut::StartOver => return Err("start over".into()),
            }
        }
        match seam.finish().0 {
            SeamOut::Emit(s) => out.push_str(&s),
            SeamOut::Hold => {}
            SeamOut::Diverged { replay } => return Err(replay),
            SeamOut::StartOver => return Err("start over".into()),
        }
        Ok(out)
    }

    #[test]
    fn swallow_hides_a_matching_restart_and_emits_what_follows() {
        let mut seam = Seam::swallow("Hello wor");
        assert_eq!(seam.feed("Hello").0, SeamOut::Hold);
        assert_eq!(seam.feed(" wor").0, SeamOut::Hold);
        assert!(seam.is_pass(), "all of the sent text was matched");
        assert_eq!(seam.feed("ld").0, SeamOut::Emit("ld".into()));
    }

    #[test]
    fn owned_text_is_judged_like_borrowed_text() {
        let mut pass = Seam::Pass;
        assert_eq!(
            pass.feed_owned("Hi".into()).0,
            SeamOut::Emit("Hi".into()),
            "passed as is"
        );
        let mut seam = Seam::swallow("Hello wor");
        assert_eq!(
            seam.feed_owned("Hello".into()).0,
            SeamOut::Hold,
            "a swallow still swallows"
        );
        assert_eq!(seam.feed_owned(" world".into()).0, SeamOut::Emit("ld".into()));
    }

    #[test]
    fn swallow_emits_the_extension_of_a_token_that_crosses_the_seam() {
        assert_eq!(run(Seam::swallow("Hello wo"), &["Hello", " world"]), Ok("rld".into()));
    }

    #[test]
    fn swallow_reports_divergence_and_a_short_answer() {
        assert!(
            run(Seam::swallow("Hello world"), &["Hello", " there"]).is_err(),
            "a different answer must not be spliced"
        );
        assert!(
            run(Seam::swallow("Hello world"), &["Hello"]).is_err(),
            "a shorter answer than what was sent is not the same answer"
        );
    }

    #[test]
    fn a_continuation_that_repeats_the_last_words_on_purpose_is_kept() {
        assert_eq!(
            run(Seam::verify("The very", ""), &[" very", " old"]),
            Ok(" very old".into()),
            "\"The very very old\" is the real text"
        );
        assert_eq!(
            run(Seam::verify("It costs $1,000", ""), &[",000", " per year"]),
            Ok(",000 per year".into()),
            "digit groups are not overlap"
        );
    }

    #[test]
    fn stripped_whitespace_is_not_sent_twice() {
        assert_eq!(
            run(Seam::verify("Para one.\n\n", "\n\n"), &["\n\nPara", " two."]),
            Ok("Para two.".into())
        );
        assert_eq!(
            run(Seam::verify("one two ", " "), &[" three"]),
            Ok("three".into()),
            "the re-emitted space is dropped"
        );
        assert_eq!(
            run(Seam::verify("one two ", " "), &["three"]),
            Ok("three".into()),
            "a continuation that does not re-emit it loses nothing"
        );
        assert_eq!(
            run(Seam::verify("a\n\n", "\n\n"), &["\nb"]),
            Ok("b".into()),
            "only what was withheld is dropped"
        );
    }

    /// Every way to cut `text` into up to three pieces at char boundaries.
    fn splits(text: &str) -> Vec<Vec<&str>> {
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let mut out = Vec::new();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                out.push(vec![&text[..a], &text[a..b], &text[b..]]);
            }
        }
        out
    }

    #[test]
    fn stripped_whitespace_re_emitted_across_deltas_is_not_sent_twice() {
        for (partial, withheld, continuation, expected) in [
            ("for cuts.\n\n", "\n\n", "\n\nThe end.\n\n", "The end.\n\n"),
            ("for cuts.\n\n", "\n\n", "\nThe end.", "The end."),
            ("for cuts.\n\n", "\n\n", "The end.", "The end."),
            ("a tëst \t ", " \t ", " \t tëst 😀", "tëst 😀"),
        ] {
            for pieces in splits(continuation) {
                assert_eq!(
                    run(Seam::verify(partial, withheld), &pieces),
                    Ok(expected.to_string()),
                    "{partial:?} continued as {pieces:?}"
                );
            }
        }
    }

    #[test]
    fn a_continuation_that_starts_over_is_swallowed() {
        assert_eq!(
            run(Seam::verify("Hello big", ""), &["Hello", " big", " wide", " world"]),
            Ok(" wide world".into())
        );
        assert_eq!(
            run(Seam::verify("Na", ""), &["Naïve", " idea"]),
            Ok("ïve idea".into()),
            "a cut inside a word"
        );
        assert_eq!(
            run(Seam::verify("日本", ""), &["日本語", "です"]),
            Ok("語です".into()),
            "a cut between multi-byte characters"
        );
    }

    #[test]
    fn a_continuation_that_begins_like_the_answer_and_differs_is_replaced_by_a_restart() {
        let start_over = Err("start over".to_string());
        assert_eq!(
            run(Seam::verify("The answer is 42", ""), &["The", " result"]),
            start_over,
            "a restart with another answer"
        );
        assert_eq!(
            run(Seam::verify("The cat sat. ", ""), &["The", " dog ran."]),
            start_over,
            "or a continuation that begins with the answer's first word: text cannot tell"
        );
        assert_eq!(
            run(Seam::verify("The answer is 42", ""), &["The", " answer"]),
            start_over,
            "a restart that ends before covering what was sent"
        );
    }

    #[test]
    fn a_real_continuation_is_not_held_back() {
        let mut seam = Seam::verify("The quick brown", "");
        assert_eq!(
            seam.feed(" fox").0,
            SeamOut::Emit(" fox".into()),
            "a continuation is judged at its first differing byte"
        );
        assert!(seam.is_pass());
    }
}
