//! The P4 text writer both generators write through: lines are indented by the braces that
//! enclose them, whatever indentation the Rust source gave them.

use core::fmt;

/// P4-16 text under construction.
#[derive(Debug, Default)]
pub(crate) struct P4 {
    text: String,
    indent: usize,
    /// Parentheses left open by the lines so far.
    parens: usize,
    /// The next line continues an expression in parentheses (a line left one open without
    /// opening a brace, whose lines the brace indents already).
    continued: bool,
    /// A line begun by `write_str` and not yet ended.
    partial: String,
}

impl P4 {
    /// The text written, with any unfinished line ended.
    pub(crate) fn finish(mut self) -> String {
        if !self.partial.is_empty() {
            let last = std::mem::take(&mut self.partial);
            self.line(&last);
        }
        self.text
    }

    /// One line, trimmed and indented four spaces per enclosing brace, and four more when it
    /// continues a parenthesis an earlier line left open. A line that starts with `}` closes
    /// a level before it is written; the braces it opens and closes after that change the
    /// level of the lines that follow. Braces in `//` comments do not count.
    pub(crate) fn line(&mut self, line: &str) {
        let line = line.trim();
        let code = line.split("//").next().unwrap_or("");
        let mut closes = code.matches('}').count();
        if line.starts_with('}') {
            self.indent = self.indent.saturating_sub(1);
            closes -= 1;
        }
        if !line.is_empty() {
            for _ in 0..self.indent + usize::from(self.continued) {
                self.text.push_str("    ");
            }
            self.text.push_str(line);
        }
        self.text.push('\n');
        let opens = code.matches('{').count();
        self.indent = (self.indent + opens).saturating_sub(closes);
        self.parens =
            (self.parens + code.matches('(').count()).saturating_sub(code.matches(')').count());
        self.continued = self.parens > 0 && (self.continued || opens == 0);
    }

    /// Every line of `block`.
    pub(crate) fn lines(&mut self, block: &str) {
        for l in block.lines() {
            self.line(l);
        }
    }

    /// An empty line.
    pub(crate) fn blank(&mut self) {
        self.line("");
    }

    /// `text` as if written with `write!`: complete lines are written, the rest waits for the
    /// end of its line.
    pub(crate) fn push_str(&mut self, text: &str) {
        self.partial.push_str(text);
        while let Some(end) = self.partial.find('\n') {
            let rest = self.partial.split_off(end + 1);
            let line = std::mem::replace(&mut self.partial, rest);
            self.line(&line[..end]);
        }
    }
}

impl fmt::Write for P4 {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write as _;

    #[test]
    fn lines_are_indented_by_their_braces() {
        let mut p = P4::default();
        p.lines(
            "control C() {
                    apply {
              x = f({
            a, b});
                y = g(a,
            b);
                if (y) { z(); }
                // a comment with a brace {
            } else {
            w();
            }
            }",
        );
        let _ = writeln!(p, "table t {{\nkey = {{ a : exact; }}\n}}");
        p.push_str("partial ");
        p.push_str("line;");
        let text = p.finish();
        let expected = "control C() {
    apply {
        x = f({
            a, b});
        y = g(a,
            b);
        if (y) { z(); }
        // a comment with a brace {
    } else {
        w();
    }
}
table t {
    key = { a : exact; }
}
partial line;
";
        assert_eq!(text, expected);
    }
}
