//! Text from outside the broker (a router's error, an upstream's reason, a
//! name an upstream listed) written into a log line or a status page.
//!
//! It must not end the line or forge another (a newline, a carriage
//! return, an escape sequence), nor hide what it says (bidirectional
//! overrides, other invisible characters), so those are written as Rust
//! writes them in a string literal (`\n`, `\u{1b}`, `\u{202e}`). Quotes are
//! not escaped: such text is never inside quotes here, and `str::escape_debug`,
//! used before, wrote an upstream's "can't connect" as `can\'t connect`.

use std::fmt;

/// Displays its text with what [`str::escape_debug`] escapes, except quotes.
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        // Runs between characters to escape are written whole.
        let mut rest = self.0;
        while let Some((at, c)) = rest
            .char_indices()
            .find(|&(_, c)| c != '\'' && c != '"' && c.escape_debug().len() > 1)
        {
            f.write_str(&rest[..at])?;
            for e in c.escape_debug() {
                f.write_char(e)?;
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::Escaped;

    #[test]
    fn line_breaks_and_hidden_characters_are_escaped_and_quotes_kept() {
        let s = |t: &str| Escaped(t).to_string();
        assert_eq!(s("can't \"connect\""), "can't \"connect\"");
        assert_eq!(s("a\nb\r\u{1b}[31m"), "a\\nb\\r\\u{1b}[31m");
        assert_eq!(s("x\u{202e}y\\z"), "x\\u{202e}y\\\\z");
        assert_eq!(s("héllo wörld ✓"), "héllo wörld ✓");
        assert_eq!(s(""), "");
        // The same as escape_debug but for quotes.
        let t = "tab\there 'q' \"d\" \u{0}\u{7f}\u{200b}";
        assert_eq!(
            s(t),
            t.escape_debug()
                .to_string()
                .replace("\\'", "'")
                .replace("\\\"", "\"")
        );
    }
}
