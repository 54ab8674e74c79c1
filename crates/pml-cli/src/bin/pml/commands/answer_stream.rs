//! The answer on stdout: streamed piece by piece as it is generated, or written once at the end;
//! a write error (closed pipe) stops the writing but not the generation, and is returned at the
//! end.

use std::io::{StdoutLock, Write};

pub struct AnswerStream {
    stdout: StdoutLock<'static>,
    streaming: bool,
    result: std::io::Result<()>,
}

impl AnswerStream {
    /// `streaming`: write each piece as it arrives; otherwise only [`AnswerStream::finish`] writes.
    pub fn new(streaming: bool) -> Self {
        Self {
            stdout: std::io::stdout().lock(),
            streaming,
            result: Ok(()),
        }
    }

    pub fn write(&mut self, piece: &str) {
        if self.streaming && self.result.is_ok() {
            self.result = self
                .stdout
                .write_all(piece.as_bytes())
                .and_then(|()| self.stdout.flush());
        }
    }

    /// Writes `text` (the whole answer) unless it was streamed, then a final newline.
    pub fn finish(mut self, text: &str) -> std::io::Result<()> {
        self.result?;
        if !self.streaming {
            self.stdout.write_all(text.as_bytes())?;
        }
        writeln!(self.stdout)?;
        self.stdout.flush()
    }
}
