//! Event streams (`text/event-stream`) read as a client reads them, the event-stream
//! parsing rules of the WHATWG HTML standard ("server-sent events"), and written back
//! byte for byte except the `data` of the JSON-RPC messages the sidecar rewrites.
//!
//! A client (the TypeScript SDK's `eventsource-parser`, any `EventSource`) reads:
//! - lines ending at CRLF, LF or a lone CR; one UTF-8 BOM at the very start is not part
//!   of the first line (a second one is, so that line names no known field);
//! - a blank line ends an event; an event still open when the stream ends is never
//!   dispatched;
//! - `:` at the start of a line makes it a comment; otherwise the field name runs to the
//!   first `:` (the whole line when there is none) and the value after it, less one
//!   leading space;
//! - the `data` lines of an event joined with LF are its data; the last `event` line its
//!   type (empty: `message`); `id` and `retry` say how to resume.
//!
//! The SDK takes an event for a JSON-RPC message when its type is empty or `message` and
//! its data is not empty; every other event (the priming event a server with an event
//! store sends first, with an `id`, a `retry` and empty data; keep-alive comments; other
//! event types) is no message to any client. [`Rewriter`] rewrites the data of message
//! events with a [`Rewrite`] and passes every other byte as it came: lines, line ends,
//! comments, `id`, `event`, `retry` and unknown fields, in order. A message whose data is
//! not a JSON object is refused ([`SseError::NotJson`]): the rewrite could not read it,
//! so it cannot tell what the client would.
//!
//! The reader is incremental: lines are passed on as they complete, except that an event
//! is held from its first `data` line to its end (its data is known only then), at most
//! `max_event` bytes of it. An event the stream leaves open at its end is treated as if
//! it had ended (no client dispatches it, but rewriting it costs nothing and fails
//! closed).

use memchr::memchr2;

use super::sanitize::{Counts, Sanitizer};
use super::wire::{rewrite_message, Rewrite};

/// Why an event stream cannot be passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    /// A message event's data is not a JSON object.
    NotJson,
    /// A message event's data is not UTF-8.
    NotUtf8,
    /// An event (or one line) longer than the reader may hold.
    TooLarge,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A line of the event being held: where its text and its whole bytes end in `held`.
#[derive(Debug, Clone, Copy)]
struct HeldLine {
    start: usize,
    /// End of the text (before the line end).
    text_end: usize,
    /// End of the line end.
    end: usize,
    data: bool,
}

/// Rewrites the message events of one event stream; see the module documentation.
#[derive(Debug)]
pub struct Rewriter {
    /// The list rewrite, if any.
    rewrite: Option<Rewrite>,
    /// The sanitizer, if any: applied after the list rewrite.
    sanitizer: Option<Sanitizer>,
    /// What the sanitizer rewrote so far.
    counts: Counts,
    max_event: usize,
    /// The stream's first line is still to come (it may start with a BOM).
    first_line: bool,
    /// Bytes not yet read as a line.
    pending: Vec<u8>,
    /// Where the search for a line end resumes in `pending`.
    scanned: usize,
    /// The current event from its first `data` line on.
    held: Vec<u8>,
    lines: Vec<HeldLine>,
    /// The current event's `data` values joined with LF, and how many there were.
    data: Vec<u8>,
    data_lines: usize,
    /// The value of the current event's last `event` line.
    event_type: Vec<u8>,
}

impl Rewriter {
    /// A reader that applies `rewrite` to each message event and holds at most
    /// `max_event` bytes of one event (or one unfinished line).
    pub fn new(rewrite: Rewrite, max_event: usize) -> Rewriter {
        Rewriter::with(Some(rewrite), None, max_event)
    }

    /// A reader that only sanitizes each message event ([`Sanitizer::message`]): a
    /// message it cannot read passes as it came.
    pub fn sanitizing(sanitizer: Sanitizer, max_event: usize) -> Rewriter {
        Rewriter::with(None, Some(sanitizer), max_event)
    }

    /// This reader, also sanitizing each message after its list rewrite.
    #[must_use]
    pub fn and_sanitize(mut self, sanitizer: Sanitizer) -> Rewriter {
        self.sanitizer = Some(sanitizer);
        self
    }

    fn with(rewrite: Option<Rewrite>, sanitizer: Option<Sanitizer>, max_event: usize) -> Rewriter {
        Rewriter {
            rewrite,
            sanitizer,
            counts: Counts::default(),
            max_event,
            first_line: true,
            pending: Vec::new(),
            scanned: 0,
            held: Vec::new(),
            lines: Vec::new(),
            data: Vec::new(),
            data_lines: 0,
            event_type: Vec::new(),
        }
    }

    /// Bytes held now (an unfinished line, an event from its first `data` line, its
    /// data): what the reader costs in memory, for the caller's budget.
    pub fn held_bytes(&self) -> usize {
        self.pending.len() + self.held.len() + self.data.len()
    }

    /// What the sanitizer rewrote so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Gives up reading: the bytes read but not yet passed on, as they came (the event
    /// held, then the unfinished line). Fed nothing more, the reader has nothing left.
    pub fn into_unread(mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.held);
        out.append(&mut self.pending);
        out
    }

    /// Reads `bytes`, appending to `out` what can be passed on now.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), SseError> {
        self.pending.extend_from_slice(bytes);
        self.lines_in_pending(false, out)
    }

    /// The stream ended: appends the rest to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), SseError> {
        self.lines_in_pending(true, out)?;
        if !self.pending.is_empty() {
            // An unfinished last line: read as a line all the same (fail closed), written
            // back without a line end.
            let text = std::mem::take(&mut self.pending);
            self.scanned = 0;
            self.line(&text, text.len(), out)?;
        }
        self.end_event(out)
    }

    /// Reads every complete line in `pending`; a CR at its very end waits for the next
    /// byte (it may be a CRLF) unless the stream has ended.
    fn lines_in_pending(&mut self, ended: bool, out: &mut Vec<u8>) -> Result<(), SseError> {
        let pending = std::mem::take(&mut self.pending);
        let mut start = 0;
        let mut from = self.scanned.max(start);
        let result = loop {
            let Some(at) = memchr2(b'\r', b'\n', &pending[from..]).map(|i| from + i) else {
                from = pending.len();
                break Ok(());
            };
            let end = if pending[at] == b'\n' {
                at + 1
            } else {
                match pending.get(at + 1) {
                    Some(b'\n') => at + 2,
                    Some(_) => at + 1,
                    None if ended => at + 1,
                    None => {
                        from = at;
                        break Ok(());
                    }
                }
            };
            if let Err(e) = self.line(&pending[start..end], at - start, out) {
                break Err(e);
            }
            start = end;
            from = end;
        };
        self.pending = pending;
        self.pending.drain(..start);
        self.scanned = from - start;
        result?;
        if self.pending.len() + self.held.len() > self.max_event {
            return Err(SseError::TooLarge);
        }
        Ok(())
    }

    /// One line: `raw` is its bytes with its line end, the text its first `text_len`.
    fn line(&mut self, raw: &[u8], text_len: usize, out: &mut Vec<u8>) -> Result<(), SseError> {
        let (mut raw, mut text) = (raw, &raw[..text_len]);
        if std::mem::take(&mut self.first_line) && text.starts_with(BOM) {
            // Not part of the line: passed on at once, whatever becomes of the line.
            out.extend_from_slice(BOM);
            raw = &raw[BOM.len()..];
            text = &text[BOM.len()..];
        }
        if text.is_empty() {
            self.end_event(out)?;
            out.extend_from_slice(raw);
            return Ok(());
        }
        let (name, value) = field(text);
        let data = name == b"data";
        if data {
            if self.data_lines > 0 {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.data_lines += 1;
        } else if name == b"event" {
            self.event_type.clear();
            self.event_type.extend_from_slice(value);
        }
        if data || !self.lines.is_empty() {
            let start = self.held.len();
            self.held.extend_from_slice(raw);
            self.lines.push(HeldLine {
                start,
                text_end: start + text.len(),
                end: self.held.len(),
                data,
            });
            if self.held.len() > self.max_event {
                return Err(SseError::TooLarge);
            }
        } else {
            // Nothing of this event needs holding yet: it passes now.
            out.extend_from_slice(raw);
        }
        Ok(())
    }

    /// The current event ended: its held lines, rewritten if it is a message.
    fn end_event(&mut self, out: &mut Vec<u8>) -> Result<(), SseError> {
        let message = self.data_lines > 0
            && !self.data.is_empty()
            && (self.event_type.is_empty() || self.event_type == b"message");
        let result = if message {
            self.rewritten(out)
        } else {
            out.extend_from_slice(&self.held);
            Ok(())
        };
        self.held.clear();
        self.lines.clear();
        self.data.clear();
        self.data_lines = 0;
        self.event_type.clear();
        result
    }

    fn rewritten(&mut self, out: &mut Vec<u8>) -> Result<(), SseError> {
        let data = match (std::str::from_utf8(&self.data), self.rewrite) {
            (Ok(data), _) => data,
            (Err(_), Some(_)) => return Err(SseError::NotUtf8),
            // Sanitizing only: what cannot be read is no message a client reads either.
            (Err(_), None) => {
                out.extend_from_slice(&self.held);
                return Ok(());
            }
        };
        let mut new = match self.rewrite {
            Some(r) => rewrite_message(data, r).ok_or(SseError::NotJson)?,
            None => data.to_owned(),
        };
        if let Some(s) = &self.sanitizer {
            if let Some(clean) = s.message(&new, &mut self.counts) {
                new = clean;
            }
        }
        if new == data {
            out.extend_from_slice(&self.held);
            return Ok(());
        }
        // The new data takes the place of the last `data` line, one line per line of it
        // (a client joins them back with LF), each with that line's own line end; the
        // other `data` lines go, every other line stays where it was. Never the first:
        // with a line between, removing it could bring a lone CR before the blank line's
        // LF, which a client would read as one CRLF, and the event would not end.
        let last = self.lines.iter().rposition(|l| l.data);
        for (i, line) in self.lines.iter().enumerate() {
            if !line.data {
                out.extend_from_slice(&self.held[line.start..line.end]);
                continue;
            }
            if Some(i) != last {
                continue;
            }
            let ending = match &self.held[line.text_end..line.end] {
                [] => &b"\n"[..],
                e => e,
            };
            for piece in new.split('\n') {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(piece.as_bytes());
                out.extend_from_slice(ending);
            }
        }
        Ok(())
    }
}

/// A line's field name and value (the value less one leading space). A comment is a
/// field with an empty name.
fn field(text: &[u8]) -> (&[u8], &[u8]) {
    match text.iter().position(|b| *b == b':') {
        Some(i) => {
            let value = &text[i + 1..];
            (&text[..i], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (text, &[]),
    }
}

/// Rewrites a whole event stream at once.
pub fn rewrite_all(text: &[u8], rewrite: Rewrite, max_event: usize) -> Result<Vec<u8>, SseError> {
    let mut out = Vec::with_capacity(text.len() + super::wire::TOOL_DESCRIPTOR.len());
    let mut r = Rewriter::new(rewrite, max_event);
    r.feed(text, &mut out)?;
    r.finish(&mut out)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::mcp::wire::{Listed, Listing, TOOL_DESCRIPTOR};
    use proptest::prelude::*;

    /// What a client of the HTML standard's event-stream parser sees: every dispatched
    /// event (type, data, last event id), every valid `retry`, every comment. Written
    /// from the standard's algorithm, independently of [`Rewriter`].
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    struct Seen {
        events: Vec<(String, String, String)>,
        retries: Vec<u64>,
        comments: Vec<String>,
    }

    fn whatwg(stream: &[u8]) -> Seen {
        let text = String::from_utf8_lossy(stream);
        let text = text.strip_prefix('\u{FEFF}').unwrap_or(&text);
        let mut seen = Seen::default();
        let (mut data, mut kind, mut id_buffer, mut last_id) =
            (String::new(), String::new(), String::new(), String::new());
        let mut rest = text;
        // A line is only a line once its end has come: the unfinished last one is not.
        while let Some(at) = rest.find(['\r', '\n']) {
            let line = &rest[..at];
            rest = if rest[at..].starts_with("\r\n") {
                &rest[at + 2..]
            } else {
                &rest[at + 1..]
            };
            if line.is_empty() {
                last_id.clone_from(&id_buffer);
                if data.is_empty() {
                    kind.clear();
                    continue;
                }
                let d = data.strip_suffix('\n').unwrap_or(&data).to_owned();
                let t = if kind.is_empty() { "message" } else { &kind };
                seen.events.push((t.to_owned(), d, last_id.clone()));
                data.clear();
                kind.clear();
                continue;
            }
            if let Some(comment) = line.strip_prefix(':') {
                seen.comments.push(comment.to_owned());
                continue;
            }
            let (name, value) = match line.split_once(':') {
                Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match name {
                "event" => value.clone_into(&mut kind),
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                "id" if !value.contains('\0') => value.clone_into(&mut id_buffer),
                "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                    seen.retries.push(value.parse().unwrap_or(u64::MAX));
                }
                _ => {}
            }
        }
        seen
    }

    /// `stream`'s lines, each with its line end, the last one possibly without.
    fn raw_lines(stream: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = stream;
        while let Some(at) = memchr2(b'\r', b'\n', rest) {
            let end = if rest[at..].starts_with(b"\r\n") {
                at + 2
            } else {
                at + 1
            };
            out.push(rest[..end].to_vec());
            rest = &rest[end..];
        }
        if !rest.is_empty() {
            out.push(rest.to_vec());
        }
        out
    }

    fn is_data_line(line: &[u8]) -> bool {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        !text.is_empty() && field(text).0 == b"data"
    }

    fn rewrite(stream: &str, r: Rewrite) -> Result<String, SseError> {
        rewrite_all(stream.as_bytes(), r, 1 << 20).map(|b| String::from_utf8(b).unwrap())
    }

    const LISTED: &str =
        r#"{"result":{"tools":[{"name":"get_section_source"}]},"jsonrpc":"2.0","id":1}"#;
    const REMOVED: &str = r#"{"result":{"tools":[]},"jsonrpc":"2.0","id":1}"#;
    const DENIED: Rewrite = Rewrite::Tools(Listing::all(false));

    #[test]
    fn a_priming_event_and_comments_pass_and_the_message_is_rewritten() {
        // What an SDK server with an event store sends under 2025-11-25.
        let stream = format!(
            "id: s1_0\nretry: 1000\ndata: \n\n: keep-alive\n\nevent: message\nid: s1_1\ndata: {LISTED}\n\n"
        );
        assert_eq!(
            rewrite(&stream, DENIED).unwrap(),
            format!("id: s1_0\nretry: 1000\ndata: \n\n: keep-alive\n\nevent: message\nid: s1_1\ndata: {REMOVED}\n\n")
        );
        // Empty data, or none, is no message: never refused.
        for quiet in [
            "data:\n\n",
            "data\n\n",
            "data: \r\n\r\n",
            "id: 1\n\n",
            "\n\n",
        ] {
            assert_eq!(rewrite(quiet, DENIED).unwrap(), quiet);
        }
    }

    #[test]
    fn only_present_data_that_is_not_json_is_refused() {
        for bad in [
            "data: not json\n\n",
            "data:  \n\n",
            "event: message\ndata: [1]\n\n",
            "data: {\"a\":\n\n",
            "data: {\"a\":1}\ndata: x\n\n",
            // Two empty lines make the data a line break, which is no JSON either.
            "data:\ndata:\n\n",
        ] {
            assert_eq!(rewrite(bad, DENIED), Err(SseError::NotJson), "{bad:?}");
        }
        assert_eq!(
            rewrite_all(b"data: {\"a\":\"\xff\"}\n\n", DENIED, 1 << 20),
            Err(SseError::NotUtf8)
        );
        // Other event types are no JSON-RPC message to any client: passed as they are.
        for other in [
            "event: ping\ndata: not json\n\n",
            "event: Message\ndata: x\n\n",
            &format!("event: endpoint\ndata: {LISTED}\n\n"),
        ] {
            assert_eq!(rewrite(other, DENIED).unwrap(), other);
        }
        // The last `event` line decides, wherever it stands.
        assert_eq!(
            rewrite(
                &format!("event: x\ndata: {LISTED}\nevent: message\n\n"),
                DENIED
            )
            .unwrap(),
            format!("event: x\ndata: {REMOVED}\nevent: message\n\n")
        );
        assert_eq!(
            rewrite(
                &format!("event: message\ndata: {LISTED}\nevent: x\n\n"),
                DENIED
            )
            .unwrap(),
            format!("event: message\ndata: {LISTED}\nevent: x\n\n")
        );
    }

    #[test]
    fn lines_end_as_a_client_ends_them_and_keep_their_ends() {
        // A lone CR ends a line: the data line after it is rewritten; each line keeps
        // its own end.
        assert_eq!(
            rewrite(&format!("event: message\rdata: {LISTED}\r\n\r"), DENIED).unwrap(),
            format!("event: message\rdata: {REMOVED}\r\n\r")
        );
        // A leading BOM is not part of the first field name, and is kept; a second one
        // is (a client reads no data line there, so neither does the rewrite).
        assert_eq!(
            rewrite(&format!("\u{feff}data: {LISTED}\n\n"), DENIED).unwrap(),
            format!("\u{feff}data: {REMOVED}\n\n")
        );
        let twice = format!("\u{feff}\u{feff}data: {LISTED}\n\n");
        assert_eq!(rewrite(&twice, DENIED).unwrap(), twice);
        // No space after the colon, or two: one space is dropped, no more.
        assert_eq!(
            rewrite(&format!("data:{LISTED}\n\n"), DENIED).unwrap(),
            format!("data: {REMOVED}\n\n")
        );
        // An unfinished event stays unfinished, rewritten all the same.
        assert_eq!(rewrite("id: 3\ndata\n", DENIED).unwrap(), "id: 3\ndata\n");
        assert_eq!(
            rewrite(&format!("data: {LISTED}"), DENIED).unwrap(),
            format!("data: {REMOVED}\n")
        );
    }

    #[test]
    fn data_over_several_lines_is_joined_and_written_back_in_place() {
        // Split over two lines with a comment and an id between: the comment and the id
        // stay, the new data takes the last data line's place.
        let stream = "data: {\"result\":{\"tools\":\r\n: between\nid: 7\ndata: [{\"name\":\"get_section_source\"}]},\"jsonrpc\":\"2.0\",\"id\":1}\r\n\r\n";
        assert_eq!(
            rewrite(stream, DENIED).unwrap(),
            ": between\nid: 7\ndata: {\"result\":{\"tools\":[]},\"jsonrpc\":\"2.0\",\"id\":1}\r\n\r\n"
        );
        // A line ended by a lone CR before a data line that goes: the blank line after
        // still ends the event (the CR never meets the blank line's LF).
        assert_eq!(
            rewrite(&format!("data: \nid: 1\rdata:{LISTED}\n\n"), DENIED).unwrap(),
            format!("id: 1\rdata: {REMOVED}\n\n")
        );
        // Added where allowed: the descriptor at the end of the last page.
        let out = rewrite(
            "event: message\ndata: {\"result\":{\"tools\":[]},\"jsonrpc\":\"2.0\",\"id\":2}\n\n",
            Rewrite::Tools(Listing::new([Listed::Show, Listed::Keep, Listed::Keep])),
        )
        .unwrap();
        assert_eq!(
            out,
            format!("event: message\ndata: {{\"result\":{{\"tools\":[{TOOL_DESCRIPTOR}]}},\"jsonrpc\":\"2.0\",\"id\":2}}\n\n")
        );
        // A payload kept as written keeps one data line per line.
        assert_eq!(
            rewrite(
                "data: {\"a\":\ndata: 1}\n\n",
                Rewrite::Resources(Listing::all(false))
            )
            .unwrap(),
            "data: {\"a\":\ndata: 1}\n\n"
        );
    }

    #[test]
    fn lines_before_the_data_pass_at_once_and_an_event_is_held_only_so_far() {
        let mut r = Rewriter::new(DENIED, 64);
        let mut out = Vec::new();
        r.feed(b"id: 1\nretry: 5\n: c\n", &mut out).unwrap();
        assert_eq!(out, b"id: 1\nretry: 5\n: c\n");
        assert_eq!(r.held_bytes(), 0);
        r.feed(b"data: {\"a\":", &mut out).unwrap();
        assert_eq!(out.len(), 19);
        r.feed(b"1}\n", &mut out).unwrap();
        assert_eq!(out.len(), 19, "the event is held until it ends");
        assert!(r.held_bytes() > 0);
        r.feed(b"\n", &mut out).unwrap();
        assert_eq!(out, b"id: 1\nretry: 5\n: c\ndata: {\"a\":1}\n\n");
        assert_eq!(r.held_bytes(), 0);
        // Over the bound: an event, or a line that never ends.
        assert_eq!(
            r.feed(format!("data: {}\n", "x".repeat(64)).as_bytes(), &mut out),
            Err(SseError::TooLarge)
        );
        let mut r = Rewriter::new(DENIED, 64);
        assert_eq!(
            r.feed(": ".repeat(40).as_bytes(), &mut Vec::new()),
            Err(SseError::TooLarge)
        );
        // A CR at the end of a chunk waits for the next: CRLF is one line end.
        let mut r = Rewriter::new(DENIED, 1 << 20);
        let mut out = Vec::new();
        r.feed(format!("data: {LISTED}\r").as_bytes(), &mut out)
            .unwrap();
        r.feed(b"\n\r", &mut out).unwrap();
        r.feed(b"\n", &mut out).unwrap();
        r.finish(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("data: {REMOVED}\r\n\r\n")
        );
    }

    #[test]
    fn replays_are_rewritten_by_their_shape() {
        let any = Rewrite::Any(Listing::all(false));
        let resources = r#"{"result":{"resourceTemplates":[{"uriTemplate":"knowtation://section-source/{p}"},{"uriTemplate":"knowtation://notes/{p}"}]},"jsonrpc":"2.0","id":3}"#;
        assert_eq!(
            rewrite(&format!("id: a\ndata: {resources}\n\nid: b\ndata: {LISTED}\n\n"), any).unwrap(),
            format!("id: a\ndata: {{\"result\":{{\"resourceTemplates\":[{{\"uriTemplate\":\"knowtation://notes/{{p}}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":3}}\n\nid: b\ndata: {REMOVED}\n\n")
        );
        // Requests and notifications from the server pass as they are.
        let note = r#"{"method":"notifications/tools/list_changed","jsonrpc":"2.0"}"#;
        let s = format!("event: message\ndata: {note}\n\n");
        assert_eq!(rewrite(&s, any).unwrap(), s);
    }

    #[test]
    fn a_sanitizing_reader_cuts_upstream_text_and_passes_what_it_cannot_read() {
        use crate::mcp::sanitize::{Sanitizer, Settings};
        let settings = Settings {
            upstream_errors: true,
            note_paths: true,
            max_message_bytes: 1 << 20,
        };
        let err = r#"{"result":{"content":[{"type":"text","text":"{\"error\":\"Upstream 500: CANARY\",\"code\":\"UPSTREAM_ERROR\"}"}],"isError":true},"jsonrpc":"2.0","id":1}"#;
        let clean = r#"{"result":{"content":[{"type":"text","text":"{\"error\":\"Upstream 500\",\"code\":\"UPSTREAM_ERROR\"}"}],"isError":true},"jsonrpc":"2.0","id":1}"#;
        let stream = format!(": c\r\nid: 1\r\ndata: {err}\r\n\r\ndata: not json CANARY\n\n");
        let mut r = Rewriter::sanitizing(Sanitizer::unknown(settings), usize::MAX);
        let mut out = Vec::new();
        r.feed(stream.as_bytes(), &mut out).unwrap();
        r.finish(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(": c\r\nid: 1\r\ndata: {clean}\r\n\r\ndata: not json CANARY\n\n")
        );
        assert_eq!(r.counts().tool_errors, 1);
        // After a list rewrite, on a replayed stream.
        let mut r = Rewriter::new(Rewrite::Any(Listing::all(false)), 1 << 20)
            .and_sanitize(Sanitizer::unknown(settings));
        let mut out = Vec::new();
        r.feed(
            format!("data: {err}\n\ndata: {LISTED}\n\n").as_bytes(),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("data: {clean}\n\ndata: {REMOVED}\n\n")
        );
        // Given up, a reader hands back what it held, as it came, and nothing twice.
        let mut r = Rewriter::sanitizing(Sanitizer::unknown(settings), usize::MAX);
        let mut out = Vec::new();
        r.feed(b"id: 2\ndata: {\"a\":\n: x\nda", &mut out).unwrap();
        assert_eq!(out, b"id: 2\n");
        assert_eq!(r.into_unread(), b"data: {\"a\":\n: x\nda");
    }

    // ---------------------------------------------------------------------------------
    // Properties.

    /// One line of a generated stream (its text has no CR or LF).
    #[derive(Debug, Clone)]
    enum Item {
        Field(&'static str, String),
        Comment(String),
        /// The data of a message, one `data:` line per line of `text`.
        Payload(String),
        Blank,
    }

    fn value() -> impl Strategy<Value = String> {
        "[ -~\u{e9}\u{feff}]{0,12}"
    }

    /// A JSON-RPC message, compact or spread over several lines, listing the tool or
    /// not, or a notification.
    fn payload() -> impl Strategy<Value = String> {
        let tools = prop_oneof![
            Just(r#"{"name":"search"}"#.to_owned()),
            Just(r#"{"name":"get_section_source","x":1}"#.to_owned()),
            Just(r#"{"uri":"knowtation://section-source/a"}"#.to_owned()),
        ];
        (
            proptest::collection::vec(tools, 0..4),
            prop_oneof![Just("tools"), Just("resources"), Just("resourceTemplates")],
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(items, key, pretty, note)| {
                let text = if note {
                    r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"x":[1,2]}}"#
                        .to_owned()
                } else {
                    format!(
                        r#"{{"result":{{"{key}":[{}]}},"jsonrpc":"2.0","id":9}}"#,
                        items.join(",")
                    )
                };
                if pretty {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    serde_json::to_string_pretty(&v).unwrap()
                } else {
                    text
                }
            })
    }

    fn item() -> impl Strategy<Value = Item> {
        prop_oneof![
            3 => (prop_oneof![Just("id"), Just("retry"), Just("event"), Just("x-other")], value())
                .prop_map(|(n, v)| Item::Field(n, v)),
            1 => Just(Item::Field("event", "message".to_owned())),
            1 => Just(Item::Field("retry", "1000".to_owned())),
            1 => Just(Item::Field("data", String::new())),
            2 => value().prop_map(Item::Comment),
            4 => payload().prop_map(Item::Payload),
            4 => Just(Item::Blank),
        ]
    }

    const ENDS: [&str; 3] = ["\n", "\r\n", "\r"];

    /// A stream of `items`, each line ended by one of the three line ends; data lines
    /// written with or without the space after the colon.
    fn stream() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<bool>(),
            proptest::collection::vec((item(), 0..3usize, any::<bool>()), 0..24),
        )
            .prop_map(|(bom, items)| {
                let mut s = String::new();
                if bom {
                    s.push('\u{feff}');
                }
                for (item, end, space) in items {
                    let end = ENDS[end];
                    let sep = if space { ": " } else { ":" };
                    match item {
                        Item::Field(n, v) => {
                            // A value starting with a space needs the separating one.
                            s.push_str(&format!("{n}: {v}{end}"));
                        }
                        Item::Comment(c) => s.push_str(&format!(":{c}{end}")),
                        Item::Payload(p) => {
                            for line in p.split('\n') {
                                let sep = if line.starts_with(' ') { ": " } else { sep };
                                s.push_str(&format!("data{sep}{line}{end}"));
                            }
                        }
                        Item::Blank => s.push_str(end),
                    }
                }
                s.into_bytes()
            })
    }

    /// What the streams of [`any_bytes_are_refused_or_read_the_same`] are made of.
    const PIECES: [&[u8]; 20] = [
        b"data:",
        b"data: ",
        b"data",
        b"event: message",
        b"event:",
        b"event: x",
        b"id: 1",
        b"retry: 9",
        b":c",
        b"{\"a\":1}",
        LISTED.as_bytes(),
        b"{",
        b"}",
        b" ",
        b"\n",
        b"\n",
        b"\r",
        b"\r\n",
        BOM,
        b"\xff",
    ];

    fn message(kind: &str, data: &str) -> bool {
        kind == "message" && !data.is_empty()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any sequence of events, comments and line ends: what a client reads of the
        /// rewritten stream is what it reads of the original, but the data of each
        /// message event, which is exactly its rewrite; every line but the data lines
        /// of a rewritten event is kept byte for byte, in order.
        #[test]
        fn a_rewrite_changes_only_the_data_of_message_events(
            s in stream(),
            r in prop_oneof![
                Just(Rewrite::Tools(Listing::all(false))),
                Just(Rewrite::Tools(Listing::all(true))),
                Just(Rewrite::Resources(Listing::all(false))),
                Just(Rewrite::Any(Listing::all(false))),
            ],
        ) {
            let before = whatwg(&s);
            // An event left open at the end is rewritten too (fail closed): as if closed.
            let closed = whatwg(&[&s[..], b"\n\n"].concat());
            let out = match rewrite_all(&s, r, 1 << 20) {
                Ok(out) => out,
                Err(e) => {
                    // Only a message whose data is not JSON is refused.
                    prop_assert_eq!(e, SseError::NotJson);
                    let refused = closed
                        .events
                        .iter()
                        .any(|(k, d, _)| message(k, d) && rewrite_message(d, r).is_none());
                    prop_assert!(refused, "refused without a message that is not JSON");
                    return Ok(());
                }
            };
            let after = whatwg(&out);
            prop_assert_eq!(&after.retries, &before.retries);
            prop_assert_eq!(&after.comments, &before.comments);
            prop_assert_eq!(after.events.len(), before.events.len());
            for ((bk, bd, bi), (ak, ad, ai)) in before.events.iter().zip(&after.events) {
                prop_assert_eq!(ak, bk);
                prop_assert_eq!(ai, bi);
                if message(bk, bd) {
                    prop_assert_eq!(Some(ad.clone()), rewrite_message(bd, r));
                } else {
                    prop_assert_eq!(ad, bd);
                }
            }
            // Byte level: the BOM stays, and the lines that are not data lines are the
            // same, in order.
            prop_assert_eq!(out.starts_with(BOM), s.starts_with(BOM));
            let keep = |stream: &[u8]| -> Vec<Vec<u8>> {
                raw_lines(stream.strip_prefix(BOM).unwrap_or(stream))
                    .into_iter()
                    .filter(|l| !is_data_line(l))
                    .collect()
            };
            prop_assert_eq!(keep(&out), keep(&s));
            // Nothing to change: the stream comes back as it came.
            if closed.events.iter().all(|(k, d, _)| {
                !message(k, d) || rewrite_message(d, r).as_deref() == Some(d.as_str())
            }) {
                prop_assert_eq!(&out, &s);
            }
        }

        /// Fed in any pieces, the stream comes out as when read at once.
        #[test]
        fn pieces_read_as_the_whole(s in stream(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6)) {
            let whole = rewrite_all(&s, DENIED, 1 << 20);
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(s.len() + 1)).collect();
            at.sort_unstable();
            let mut r = Rewriter::new(DENIED, 1 << 20);
            let mut out = Vec::new();
            let mut from = 0;
            let mut result = Ok(());
            for cut in at.into_iter().chain([s.len()]) {
                result = result.and_then(|()| r.feed(&s[from..cut], &mut out));
                from = cut;
            }
            let result = result.and_then(|()| r.finish(&mut out));
            match whole {
                Ok(w) => {
                    prop_assert!(result.is_ok());
                    prop_assert_eq!(out, w);
                }
                Err(e) => prop_assert_eq!(result, Err(e)),
            }
        }

        /// Any bytes at all, made of the pieces event streams are made of: refused
        /// exactly when an event a client would take for a message (its stream closed)
        /// has data that is not a JSON object; otherwise every message a client reads is
        /// rewritten and every other event is read as before.
        #[test]
        fn any_bytes_are_refused_or_read_the_same(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES.to_vec()), 0..24),
        ) {
            let s = pieces.concat();
            let closed = whatwg(&[&s[..], b"\n\n"].concat());
            let unreadable = |(k, d, _): &(String, String, String)| {
                message(k, d) && (d.contains('\u{fffd}') || rewrite_message(d, DENIED).is_none())
            };
            let Ok(out) = rewrite_all(&s, DENIED, 1 << 20) else {
                prop_assert!(closed.events.iter().any(unreadable), "refused: {:?}", String::from_utf8_lossy(&s));
                return Ok(());
            };
            prop_assert!(!closed.events.iter().any(|e| message(&e.0, &e.1) && rewrite_message(&e.1, DENIED).is_none()));
            let (before, after) = (whatwg(&s), whatwg(&out));
            prop_assert_eq!(after.events.len(), before.events.len());
            for ((bk, bd, _), (ak, ad, _)) in before.events.iter().zip(&after.events) {
                prop_assert_eq!(ak, bk);
                if message(bk, bd) {
                    prop_assert_eq!(Some(ad.clone()), rewrite_message(bd, DENIED));
                } else {
                    prop_assert_eq!(ad, bd);
                }
            }
        }
    }
}
