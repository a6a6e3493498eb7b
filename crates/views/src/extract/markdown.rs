//! One pass of pulldown-cmark over a note body: every heading's level and position, the
//! text of the visible ones as mdast would compute it, and where substantive top-level
//! blocks start (spec §6, §8).

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use super::prepare::{numeric_reference, prepare, Prepared};
use crate::js;

/// Where a heading sits in the body (byte offsets into the parsed text).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadingPos {
    pub level: u8,
    pub start: usize,
    pub end: usize,
}

/// What the extractor needs from the Markdown, and nothing else.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Every heading in document order, visible or not.
    pub headings: Vec<HeadingPos>,
    /// Final text of the first `max_visible` headings.
    pub texts: Vec<String>,
    /// Starts of substantive top-level non-heading blocks, ascending.
    pub body_starts: Vec<usize>,
    /// Length of the parsed text (the end of the last section's range).
    pub len: usize,
}

/// Scans `body` (the reference parser's leading-BOM removal already applied).
pub(crate) fn scan(body: &str, max_visible: usize) -> Scan {
    let prepared = prepare(body);
    let body: &str = &prepared.text;
    // Room for a typical note's headings and blocks, so the vectors rarely regrow.
    let mut out = Scan {
        headings: Vec::with_capacity(16),
        texts: Vec::with_capacity(16.min(max_visible)),
        body_starts: Vec::with_capacity(32),
        len: body.len(),
    };
    // Plain CommonMark: no extension may change what counts as a heading or a block.
    let parser = Parser::new_ext(body, Options::empty()).into_offset_iter();

    let mut depth = 0usize;
    let mut block: Option<TopBlock> = None;
    // One collector for every heading, so its buffers are allocated once per note.
    let mut collector = HeadingText::default();
    let mut in_heading = false;

    for (event, range) in parser {
        match &event {
            Event::Start(tag) => {
                if depth == 0 {
                    block = Some(TopBlock {
                        start: range.start,
                        is_heading: matches!(tag, Tag::Heading { .. }),
                        substantive: false,
                    });
                }
                depth += 1;
                if let Tag::Heading { level, .. } = tag {
                    out.headings.push(HeadingPos {
                        level: *level as u8,
                        start: range.start,
                        end: range.end,
                    });
                    if out.texts.len() < max_visible {
                        collector.reset();
                        in_heading = true;
                    }
                } else if in_heading {
                    collector.open(tag);
                }
            }
            Event::End(tag_end) => {
                depth = depth.saturating_sub(1);
                if let TagEnd::Heading(_) = tag_end {
                    if in_heading {
                        out.texts.push(collector.finish(&prepared));
                        in_heading = false;
                    }
                } else if in_heading {
                    collector.close(tag_end);
                }
                if depth == 0 {
                    if let Some(b) = block.take() {
                        if b.substantive && !b.is_heading {
                            out.body_starts.push(b.start);
                        }
                    }
                }
            }
            Event::Rule => {
                if depth == 0 {
                    out.body_starts.push(range.start);
                } else if let Some(b) = block.as_mut() {
                    b.substantive = true;
                }
            }
            Event::Text(s) | Event::Code(s) | Event::Html(s) | Event::InlineHtml(s) => {
                // A numeric character reference is its own Text event spanning `&#…;`.
                let replacement;
                let s: &str = match (&event, body.get(range.clone())) {
                    (Event::Text(_), Some(src)) if src.starts_with("&#") => {
                        match numeric_reference(src) {
                            Some(c) => {
                                replacement = c.to_string();
                                &replacement
                            }
                            None => s,
                        }
                    }
                    _ => s,
                };
                if let Some(b) = block.as_mut() {
                    if !b.substantive && !js::is_blank(s) {
                        b.substantive = true;
                    }
                }
                if in_heading {
                    match event {
                        Event::Text(_) => collector.text(s),
                        _ => collector.literal(s),
                    }
                }
            }
            Event::SoftBreak if in_heading => collector.text("\n"),
            Event::HardBreak if in_heading => collector.hard_break(),
            // Math, footnotes and task lists are off (Options::empty()); nothing else
            // carries text.
            _ => {}
        }
    }
    out
}

/// The top-level block being walked.
struct TopBlock {
    start: usize,
    is_heading: bool,
    substantive: bool,
}

/// Heading text as the gateway computes it over the mdast inline tree (spec §6).
///
/// Each open inline element is a frame of child strings that will be joined with one
/// space; adjacent text (including soft breaks as `\n`) merges into one child, as mdast
/// merges it into one text node. Inside an image everything concatenates into the alt.
#[derive(Default)]
struct HeadingText {
    /// Frames of open elements; index 0 is the heading itself.
    frames: Vec<Frame>,
    /// Nesting depth of images; > 0 means "collecting alt text".
    image_depth: usize,
    alt: String,
}

#[derive(Default)]
struct Frame {
    parts: Vec<String>,
    last_is_text: bool,
}

impl HeadingText {
    /// Ready for the next heading; the frames' buffer and the heading frame's list of
    /// parts are kept.
    fn reset(&mut self) {
        self.frames.truncate(1);
        if let Some(f) = self.frames.first_mut() {
            f.parts.clear();
            f.last_is_text = false;
        }
        self.image_depth = 0;
        self.alt.clear();
    }

    fn top(&mut self) -> &mut Frame {
        if self.frames.is_empty() {
            self.frames.push(Frame::default());
        }
        let last = self.frames.len() - 1;
        &mut self.frames[last]
    }

    fn push_node(&mut self, value: String) {
        let f = self.top();
        f.parts.push(value);
        f.last_is_text = false;
    }

    fn text(&mut self, s: &str) {
        if self.image_depth > 0 {
            self.alt.push_str(s);
            return;
        }
        let f = self.top();
        match f.parts.last_mut() {
            Some(last) if f.last_is_text => last.push_str(s),
            _ => {
                f.parts.push(s.to_owned());
                f.last_is_text = true;
            }
        }
    }

    /// Inline code and inline HTML: their literal value, as a node of their own.
    fn literal(&mut self, s: &str) {
        if self.image_depth > 0 {
            self.alt.push_str(s);
        } else {
            self.push_node(s.to_owned());
        }
    }

    fn hard_break(&mut self) {
        // A break node has no value: nothing inside an alt, one space when joined.
        if self.image_depth == 0 {
            self.push_node(" ".to_owned());
        }
    }

    fn open(&mut self, tag: &Tag<'_>) {
        if matches!(tag, Tag::Image { .. }) {
            if self.image_depth == 0 {
                self.alt.clear();
            }
            self.image_depth += 1;
        } else if self.image_depth == 0 {
            self.top();
            self.frames.push(Frame::default());
        }
    }

    fn close(&mut self, tag: &TagEnd) {
        if matches!(tag, TagEnd::Image) {
            self.image_depth = self.image_depth.saturating_sub(1);
            if self.image_depth == 0 {
                let alt = std::mem::take(&mut self.alt);
                self.push_node(alt);
            }
        } else if self.image_depth == 0 && self.frames.len() > 1 {
            if let Some(f) = self.frames.pop() {
                self.push_node(f.parts.join(" "));
            }
        }
    }

    /// The heading's final text; the collector is left for [`Self::reset`].
    fn finish(&mut self, prepared: &Prepared<'_>) -> String {
        let joined = match self.frames.first_mut() {
            // Plain text alone (the usual heading) is one part: no join needed.
            Some(f) if f.parts.len() == 1 => f.parts.pop().unwrap_or_default(),
            Some(f) => std::mem::take(&mut f.parts).join(" "),
            None => String::new(),
        };
        let joined = prepared.restore(joined);
        if is_nfc_quick(joined.chars()) == IsNormalized::Yes {
            collapse_whitespace(joined)
        } else {
            collapse_whitespace(joined.nfc().collect::<String>())
        }
    }
}

/// [`js::collapse_whitespace`], without a copy when there is nothing to collapse: no
/// whitespace but single spaces between other characters.
fn collapse_whitespace(s: String) -> String {
    let bytes = s.as_bytes();
    let mut prev_space = true;
    let mut collapsed = true;
    for &b in bytes {
        let space = b == b' ';
        // Every whitespace character but the space is an ASCII control (tab to CR) or
        // not ASCII; the rare non-ASCII text is checked char by char below.
        if (space && prev_space) || (b'\t'..=b'\r').contains(&b) || !b.is_ascii() {
            collapsed = false;
            break;
        }
        prev_space = space;
    }
    collapsed &= !prev_space || bytes.is_empty();
    if !collapsed && !s.is_ascii() {
        let mut prev_space = true;
        collapsed = s.chars().all(|c| {
            let ok = if c == ' ' {
                !prev_space
            } else {
                !js::is_js_whitespace(c)
            };
            prev_space = c == ' ';
            ok
        }) && (!prev_space || s.is_empty());
    }
    if collapsed {
        s
    } else {
        js::collapse_whitespace(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_without_copy_agrees_with_js() {
        for s in [
            "",
            " ",
            "a",
            "a b",
            " a",
            "a ",
            "a  b",
            "a\tb",
            "a\nb",
            "a\u{b}b\u{c}c\rd",
            "a\u{a0}b",
            "a\u{3000}b",
            "a\u{feff}",
            "\u{2028}a",
            "a \u{85} b",
            "é ü 😀",
            "x  ",
            "é  ü",
            "é\tü",
            "é ",
            " é",
            "é \u{2009}ü",
        ] {
            assert_eq!(
                collapse_whitespace(s.to_owned()),
                js::collapse_whitespace(s),
                "{s:?}"
            );
        }
    }
}
