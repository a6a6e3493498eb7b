//! Raw-file frontmatter: the split and a js-yaml-compatible reading of `title`
//! (spec §2, §5).
//!
//! The gateway runs js-yaml 4.1.1's `load` (default schema) on the block and reads
//! `title` from the result. `saphyr-parser` supplies the YAML events (each scalar with
//! its style and explicit tag); everything js-yaml decides on top of the syntax is done
//! here: scalar typing, explicit tags, anchors shared by reference, merge keys,
//! duplicate keys, key stringification and the single-document rule. So are the places
//! where js-yaml's reading of the syntax differs from saphyr's (which follows the YAML
//! spec): tabs, properties on a block mapping's first key, plain scalars continued
//! inside flow collections, control characters, and some indentation and escapes saphyr
//! refuses but js-yaml accepts (see `Repair`). Any error gives empty frontmatter, as
//! the gateway's `catch` does.

use super::frontmatter::{date_utc, time_clip, FmValue, Frontmatter, MAX_STRING_DEPTH};
use crate::js;
use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span, Tag};
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

/// Splits a raw file into its frontmatter and its body (spec §2).
///
/// Only `title` is ever read from the block.
pub fn split_raw(text: &str) -> (Frontmatter, &str) {
    match split(text) {
        None => (Frontmatter::default(), js::trim_end(text)),
        Some((block, rest)) => (
            Frontmatter {
                title: load_title(block),
                project: None,
            },
            js::trim_end(rest),
        ),
    }
}

/// `/^---\r?\n([\s\S]*?)\r?\n---\r?\n([\s\S]*)$/`: the YAML block and the rest.
fn split(text: &str) -> Option<(&str, &str)> {
    let open = text.strip_prefix("---")?;
    let inner = open.get(line_break(open.as_bytes())?..)?;
    let b = inner.as_bytes();
    // The lazy group ends at the first line break followed by `---` and a line break.
    (0..b.len()).find_map(|end| {
        let dashes = end + line_break(&b[end..])?;
        if !b[dashes..].starts_with(b"---") {
            return None;
        }
        let rest = dashes + 3 + line_break(&b[dashes + 3..])?;
        // `end` and `rest` sit next to ASCII line breaks, so both are char boundaries.
        Some((inner.get(..end)?, inner.get(rest..)?))
    })
}

/// The length of the `\r?\n` at the start of `b`, if there is one.
fn line_break(b: &[u8]) -> Option<usize> {
    if b.starts_with(b"\r\n") {
        Some(2)
    } else if b.starts_with(b"\n") {
        Some(1)
    } else {
        None
    }
}

/// The `title` of the loaded block, if the block loads to a mapping that has one.
///
/// saphyr is stricter than js-yaml in a few places where js-yaml's reading does not
/// depend on the offending text; there the block is repaired (whitespace, or an escape
/// rewritten as an equivalent one; never content) and parsed again, within the work
/// budget.
fn load_title(block: &str) -> Option<FmValue> {
    let mut work = Work::new(block.len());
    let mut text = Cow::Borrowed(block);
    // Spaces added in front of lines (by line index), which js-yaml never saw.
    let mut pads = HashMap::new();
    loop {
        work.spend(text.len()).ok()?;
        match Loader::new(&text, &mut work, &pads).load() {
            Ok(title) => return title,
            Err(YamlError::Repairable(at, kind)) => {
                let (repaired, pad) = repair(&text, at, kind)?;
                if let Some((line, added)) = pad {
                    *pads.entry(line).or_insert(0) += added;
                }
                text = Cow::Owned(repaired);
            }
            Err(YamlError::Invalid) => return None,
        }
    }
}

/// Deepest collection nesting accepted. js-yaml recurses per level and overflows V8's
/// stack (a `RangeError`, caught like any YAML error) somewhere between 1,000 and 5,000
/// levels depending on the style; deeper blocks are errors here from 1,000 on.
const MAX_NESTING: usize = MAX_STRING_DEPTH;

/// Work allowed per block beyond four units per input byte. One unit is an event, a
/// byte parsed, a merged key, a byte of a stringified key or a node or byte of the
/// converted title; plausible frontmatter stays far below it, while alias bombs (which
/// js-yaml shares by reference but `String()` would expand) stop here instead of
/// exhausting memory.
const BASE_WORK: usize = 1_000_000;

/// Why loading failed. The cause is never reported (the gateway swallows it).
#[derive(Debug)]
enum YamlError {
    /// js-yaml would throw too.
    Invalid,
    /// saphyr refused whitespace that js-yaml accepts, at this char index.
    Repairable(usize, Repair),
}

/// The whitespace repairs [`repair`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repair {
    /// `key:<TAB>value`: saphyr wants a space after the `:`.
    TabAfterColon,
    /// A quoted scalar whose continuation lines are less indented than saphyr wants.
    QuotedIndent,
    /// A line inside a flow collection less indented than saphyr wants.
    FlowIndent,
    /// A tab in the leading blanks of a quoted scalar's continuation line.
    QuotedTab,
    /// A surrogate pair written as two `\u` escapes, which js-yaml joins and saphyr
    /// refuses; rewritten as one `\U` escape.
    SurrogatePair,
}

type Loaded<T> = Result<T, YamlError>;

/// An index into [`Loader::nodes`].
type NodeId = usize;

/// A JavaScript value built by js-yaml. Aliases are shared ids, as js-yaml shares the
/// objects themselves, so cycles are possible.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Number(f64),
    Str(String),
    Date(f64),
    Bytes(Vec<u8>),
    Array(Vec<NodeId>),
    /// Own enumerable properties of a plain object; their order never matters here.
    Object(HashMap<String, NodeId>),
}

/// A collection being read.
#[derive(Debug)]
enum Frame {
    Seq {
        node: NodeId,
        tag: Option<String>,
        anchor: usize,
        flow: bool,
        /// The column of a block collection's entries.
        indent: usize,
    },
    Map {
        node: NodeId,
        tag: Option<String>,
        flow: bool,
        /// The column of a block collection's keys.
        indent: usize,
        /// Whether a key has been read (js-yaml treats the first one specially).
        seen_key: bool,
        /// The key read and waiting for its value, and whether it is a merge key.
        key: Option<(NodeId, bool)>,
        /// Keys set by a merge, which a later explicit key may override.
        overridable: HashSet<String>,
    },
}

impl Frame {
    fn flow(&self) -> bool {
        match self {
            Frame::Seq { flow, .. } | Frame::Map { flow, .. } => *flow,
        }
    }

    /// The indentation of a block collection, `None` for a flow one.
    fn block_indent(&self) -> Option<usize> {
        match self {
            Frame::Seq { flow, indent, .. } | Frame::Map { flow, indent, .. } => {
                (!*flow).then_some(*indent)
            }
        }
    }
}

/// The budget of [`BASE_WORK`] plus four units per input byte.
#[derive(Debug)]
struct Work {
    left: usize,
}

impl Work {
    fn new(input_len: usize) -> Work {
        Work {
            left: BASE_WORK.saturating_add(input_len.saturating_mul(4)),
        }
    }

    fn spend(&mut self, units: usize) -> Loaded<()> {
        self.left = self.left.checked_sub(units).ok_or(YamlError::Invalid)?;
        Ok(())
    }
}

/// Maps saphyr's char indices to byte offsets; queries stay close to each other, so
/// a cursor keeps that linear.
#[derive(Debug)]
struct Text<'a> {
    text: &'a str,
    chars: usize,
    bytes: usize,
}

impl<'a> Text<'a> {
    fn new(text: &'a str) -> Text<'a> {
        Text {
            text,
            chars: 0,
            bytes: 0,
        }
    }

    /// The byte offset of char index `at` (the end of the text past the last char).
    /// Costs the distance from the previous query.
    fn byte(&mut self, at: usize) -> usize {
        for c in self.text[..self.bytes].chars().rev() {
            if self.chars <= at {
                break;
            }
            self.chars -= 1;
            self.bytes -= c.len_utf8();
        }
        for c in self.text[self.bytes..].chars() {
            if self.chars == at {
                break;
            }
            self.chars += 1;
            self.bytes += c.len_utf8();
        }
        self.bytes
    }
}

/// Where a node starts, for js-yaml's placement rules.
#[derive(Debug, Clone, Copy)]
struct Start {
    /// Char index of the node's first character (its properties, if any).
    at: usize,
    /// Whether the node carries an anchor or a tag.
    props: bool,
}

/// Builds js-yaml's result from saphyr events.
#[derive(Debug)]
struct Loader<'a, 'w> {
    text: Text<'a>,
    nodes: Vec<Node>,
    /// saphyr anchor id → the node it names.
    anchors: HashMap<usize, NodeId>,
    stack: Vec<Frame>,
    root: Option<NodeId>,
    work: &'w mut Work,
    /// Spaces [`repair`] put in front of lines, by line index.
    pads: &'w HashMap<usize, usize>,
}

impl<'a, 'w> Loader<'a, 'w> {
    fn new(text: &'a str, work: &'w mut Work, pads: &'w HashMap<usize, usize>) -> Loader<'a, 'w> {
        Loader {
            pads,
            text: Text::new(text),
            nodes: Vec::new(),
            anchors: HashMap::new(),
            stack: Vec::new(),
            root: None,
            work,
        }
    }

    /// Loads the block and returns its `title` (`None` when the result is not a
    /// mapping or has no such key).
    fn load(mut self) -> Loaded<Option<FmValue>> {
        let block = self.text.text;
        if block.contains('\0') {
            // js-yaml refuses NUL anywhere, comments included.
            return Err(YamlError::Invalid);
        }
        let bad_chars = Unprintable::find(block);
        let mut parser = Parser::new_from_str(block);
        let mut documents = 0_usize;
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(|e| self.scan_error(&e))?;
            self.work.spend(1)?;
            match event {
                Event::DocumentStart(_) => {
                    documents += 1;
                    if documents > 1 {
                        // load() throws when the stream holds more than one document.
                        return Err(YamlError::Invalid);
                    }
                }
                Event::Alias(anchor) => {
                    let start = Start {
                        at: span.start.index(),
                        props: false,
                    };
                    self.check_placement(start)?;
                    let node = *self.anchors.get(&anchor).ok_or(YamlError::Invalid)?;
                    self.complete(node, false)?;
                }
                Event::Scalar(value, style, anchor, tag) => {
                    let props = anchor != 0 || tag.is_some();
                    self.check_scalar(&bad_chars, span, style, props, &value)?;
                    self.check_placement(Start {
                        at: span.start.index(),
                        props,
                    })?;
                    let tag = tag.as_deref().map(tag_name);
                    let (node, is_merge) = scalar(&value, style, tag.as_deref())?;
                    let id = self.add(node);
                    self.name(anchor, id);
                    self.complete(id, is_merge)?;
                }
                Event::SequenceStart(anchor, tag) => {
                    let flow = self.opens_flow(span, '[')?;
                    let tag = tag.as_deref().map(tag_name);
                    let indent = span.end.col();
                    self.open(Node::Array(Vec::new()), anchor, |node| Frame::Seq {
                        node,
                        tag,
                        anchor,
                        flow,
                        indent,
                    })?;
                }
                Event::MappingStart(anchor, tag) => {
                    let flow = self.opens_flow(span, '{')?;
                    let tag = tag.as_deref().map(tag_name);
                    let indent = span.end.col();
                    self.open(Node::Object(HashMap::new()), anchor, |node| Frame::Map {
                        node,
                        tag,
                        flow,
                        indent,
                        seen_key: false,
                        key: None,
                        overridable: HashSet::new(),
                    })?;
                }
                Event::SequenceEnd => match self.stack.pop() {
                    Some(Frame::Seq {
                        node, tag, anchor, ..
                    }) => {
                        let id = self.finish_seq(node, tag.as_deref(), anchor)?;
                        self.complete(id, false)?;
                    }
                    _ => return Err(YamlError::Invalid),
                },
                Event::MappingEnd => match self.stack.pop() {
                    Some(Frame::Map {
                        node,
                        tag,
                        key: None,
                        ..
                    }) => {
                        self.finish_map(node, tag.as_deref())?;
                        self.complete(node, false)?;
                    }
                    _ => return Err(YamlError::Invalid),
                },
                Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
            }
        }
        let Some(root) = self.root else {
            return Ok(None);
        };
        // The gateway reads `frontmatter.title` only from a plain object.
        let Node::Object(entries) = &self.nodes[root] else {
            return Ok(None);
        };
        let Some(&title) = entries.get("title") else {
            return Ok(None);
        };
        to_fm(&self.nodes, self.work, title).map(Some)
    }

    /// Classifies a saphyr error: a few are whitespace js-yaml accepts.
    fn scan_error(&self, e: &ScanError) -> YamlError {
        let at = e.marker().index();
        // saphyr's messages are matched as is; the tests pin them.
        match e.info() {
            "':' must be followed by a valid YAML whitespace" => {
                YamlError::Repairable(at, Repair::TabAfterColon)
            }
            "invalid indentation in quoted scalar" => {
                YamlError::Repairable(at, Repair::QuotedIndent)
            }
            // Raised only for continuation lines of quoted scalars, whose leading blanks
            // both parsers drop.
            "tab cannot be used as indentation" => YamlError::Repairable(at, Repair::QuotedTab),
            "while parsing a quoted scalar, found invalid Unicode character escape code" => {
                YamlError::Repairable(at, Repair::SurrogatePair)
            }
            // saphyr only checks indentation against the block indent inside flow
            // collections; js-yaml does not check it there at all.
            "invalid indentation in flow construct" | "invalid indentation" => {
                YamlError::Repairable(at, Repair::FlowIndent)
            }
            _ => YamlError::Invalid,
        }
    }

    /// Whether a collection starting at `span` is in flow style: inside a flow
    /// collection, or opened by `bracket`.
    fn opens_flow(&mut self, span: Span, bracket: char) -> Loaded<bool> {
        let start = self.text.byte(span.start.index());
        let end = self.text.byte(span.end.index());
        // The start span covers the properties, if any, and a flow collection's opening
        // bracket and the blanks after it; properties cannot contain brackets.
        let head = self.text.text[start..end].trim_end_matches([' ', '\t', '\n', '\r']);
        let own = head.ends_with(bracket);
        self.check_placement(Start {
            at: span.start.index(),
            props: head.len() > usize::from(own),
        })?;
        Ok(own || self.stack.last().is_some_and(Frame::flow))
    }

    /// Scalars js-yaml reads differently from saphyr: characters it refuses, plain
    /// scalars it will not start, empty implicit keys, and plain scalars inside flow
    /// collections continued on a line indented no deeper than the enclosing block.
    fn check_scalar(
        &mut self,
        bad_chars: &Unprintable,
        span: Span,
        style: ScalarStyle,
        props: bool,
        value: &str,
    ) -> Loaded<()> {
        let start = self.text.byte(span.start.index());
        let end = self.text.byte(span.end.index());
        let raw = &self.text.text[start..end];
        // Properties belong to the span but not to the content: js-yaml checks only
        // the content's characters.
        let content = if props { skip_properties(raw) } else { raw };
        let content_at = span.start.index() + raw[..raw.len() - content.len()].chars().count();
        if bad_chars.inside(content_at, span.end.index(), style) {
            return Err(YamlError::Invalid);
        }
        if style != ScalarStyle::Plain {
            return Ok(());
        }
        let in_flow = self.stack.last().is_some_and(Frame::flow);
        // js-yaml `readPlainScalar` refuses these first characters, and `-` or `?`
        // followed by a blank (or, in flow, by a flow indicator).
        let mut chars = self.text.text[start + raw.len() - content.len()..].chars();
        let first = chars.next();
        let indicator_follows = chars.next().is_none_or(|c| {
            matches!(c, ' ' | '\t' | '\n' | '\r')
                || (in_flow && matches!(c, ',' | '[' | ']' | '{' | '}'))
        });
        let refused_start = match first {
            // An empty scalar has no content to start.
            _ if value.is_empty() => false,
            Some('-' | '?') => indicator_follows,
            Some(c) => "\t ,[]{}#&*!|>'\"%@`".contains(c),
            None => false,
        };
        if refused_start {
            return Err(YamlError::Invalid);
        }
        if value.is_empty() && !props {
            // `:` with no key before it: js-yaml wants `?` for an empty key.
            if let Some(Frame::Map {
                flow: false,
                key: None,
                ..
            }) = self.stack.last()
            {
                if !self.text.text[..start]
                    .trim_end_matches([' ', '\t', '\n', '\r'])
                    .ends_with('?')
                {
                    return Err(YamlError::Invalid);
                }
            }
        }
        if in_flow && content.contains(['\n', '\r']) {
            // js-yaml ends the scalar at a line indented less than the enclosing block
            // collection's column + 1 (measured before any repair), and then finds no
            // comma there.
            let needed = self
                .stack
                .iter()
                .rev()
                .find_map(Frame::block_indent)
                .map_or(0, |indent| indent + 1);
            // saphyr counts lines from 1 and breaks them as `lines` does.
            let props_len = raw.len() - content.len();
            let first_line = span.start.line() - 1 + lines(&raw[..props_len]).count() - 1;
            let short = lines(content)
                .enumerate()
                .skip(1)
                .filter(|(_, line)| !line.trim_matches([' ', '\t']).is_empty())
                .any(|(i, line)| {
                    let spaces = line.len() - line.trim_start_matches(' ').len();
                    let added = self.pads.get(&(first_line + i)).copied().unwrap_or(0);
                    spaces.saturating_sub(added) < needed
                });
            if short {
                return Err(YamlError::Invalid);
            }
        }
        Ok(())
    }

    /// js-yaml's placement rules for a node starting in a block collection:
    /// - no tab may precede an implicit mapping key or a `-` entry on its line (js-yaml
    ///   will not start or continue a block collection after a tab, "tab characters must
    ///   not be used in indentation");
    /// - the first implicit key of a block mapping may not carry properties: js-yaml
    ///   reads properties on that line as the mapping's, and then refuses a block
    ///   mapping there.
    fn check_placement(&mut self, start: Start) -> Loaded<()> {
        let (first_key, in_seq) = match self.stack.last() {
            Some(Frame::Map {
                flow: false,
                key: None,
                seen_key,
                ..
            }) => (Some(!*seen_key), false),
            Some(Frame::Seq { flow: false, .. }) => (None, true),
            _ => return Ok(()),
        };
        let b = self.text.byte(start.at);
        let before = &self.text.text[..b];
        let line = &before[before.rfind(['\n', '\r']).map_or(0, |i| i + 1)..];
        if let Some(first) = first_key {
            if let Some(Frame::Map { seen_key, .. }) = self.stack.last_mut() {
                *seen_key = true;
            }
            let to_indicator = before.trim_end_matches([' ', '\t', '\n', '\r']);
            if let Some(indicator_at) = to_indicator.strip_suffix('?').map(str::len) {
                // An explicit key (`? key`): only the `?` must not follow a tab.
                let line_start = before[..indicator_at]
                    .rfind(['\n', '\r'])
                    .map_or(0, |i| i + 1);
                if before[line_start..indicator_at].contains('\t') {
                    return Err(YamlError::Invalid);
                }
            } else if line.contains('\t') || (first && start.props) {
                return Err(YamlError::Invalid);
            }
        } else if in_seq {
            // Only an entry on its `-` line: check the indentation before the dash.
            let entry = line.trim_end_matches([' ', '\t']);
            if let Some(indent) = entry.strip_suffix('-') {
                if indent.contains('\t') {
                    return Err(YamlError::Invalid);
                }
            }
        }
        Ok(())
    }

    fn add(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Points an anchor (0 means none) at a node; a later anchor of the same name is a
    /// new id in saphyr, so redefinitions work as in js-yaml.
    fn name(&mut self, anchor: usize, id: NodeId) {
        if anchor != 0 {
            self.anchors.insert(anchor, id);
        }
    }

    /// Starts a collection. js-yaml names it before reading its content, so an alias
    /// inside may refer to it.
    fn open(
        &mut self,
        node: Node,
        anchor: usize,
        frame: impl FnOnce(NodeId) -> Frame,
    ) -> Loaded<()> {
        if self.stack.len() >= MAX_NESTING {
            return Err(YamlError::Invalid);
        }
        let id = self.add(node);
        self.name(anchor, id);
        self.stack.push(frame(id));
        Ok(())
    }

    /// Hands a finished node to the collection being read (or makes it the root).
    fn complete(&mut self, id: NodeId, is_merge: bool) -> Loaded<()> {
        let Loader {
            nodes, stack, work, ..
        } = self;
        match stack.last_mut() {
            None if self.root.is_none() => self.root = Some(id),
            None => return Err(YamlError::Invalid),
            Some(Frame::Seq { node, .. }) => match &mut nodes[*node] {
                Node::Array(items) => items.push(id),
                _ => return Err(YamlError::Invalid),
            },
            Some(Frame::Map {
                node,
                key,
                overridable,
                ..
            }) => match key.take() {
                None => *key = Some((id, is_merge)),
                Some((key, key_is_merge)) => {
                    store_pair(nodes, work, *node, overridable, key, key_is_merge, id)?;
                }
            },
        }
        Ok(())
    }

    /// Applies a sequence's explicit tag (js-yaml `composeNode`); returns the node that
    /// stands for it (`!!pairs` builds a new array).
    fn finish_seq(&mut self, node: NodeId, tag: Option<&str>, anchor: usize) -> Loaded<NodeId> {
        let Node::Array(items) = &self.nodes[node] else {
            return Err(YamlError::Invalid);
        };
        let Some(name) = tag.filter(|&t| t != "!") else {
            return Ok(node);
        };
        match name.strip_prefix(CORE) {
            Some("seq") => Ok(node),
            Some("omap") => {
                let mut seen = HashSet::new();
                for &item in items {
                    let (key, _) = single_pair(&self.nodes, item)?;
                    if !seen.insert(key) {
                        return Err(YamlError::Invalid);
                    }
                }
                Ok(node)
            }
            Some("pairs") => {
                let pairs = items
                    .iter()
                    .map(|&item| single_pair(&self.nodes, item).map(|(k, v)| (k.to_owned(), v)))
                    .collect::<Loaded<Vec<_>>>()?;
                self.work.spend(pairs.len())?;
                let mut out = Vec::with_capacity(pairs.len());
                for (key, value) in pairs {
                    let key = self.add(Node::Str(key));
                    out.push(self.add(Node::Array(vec![key, value])));
                }
                let id = self.add(Node::Array(out));
                // js-yaml re-points the anchor at the constructed array.
                self.name(anchor, id);
                Ok(id)
            }
            _ => Err(YamlError::Invalid),
        }
    }

    /// Applies a mapping's explicit tag (js-yaml `composeNode`).
    fn finish_map(&self, node: NodeId, tag: Option<&str>) -> Loaded<()> {
        let Node::Object(entries) = &self.nodes[node] else {
            return Err(YamlError::Invalid);
        };
        match tag {
            None | Some("!") => Ok(()),
            Some(t) => match t.strip_prefix(CORE) {
                Some("map") => Ok(()),
                // A set's values must all be null.
                Some("set")
                    if entries
                        .values()
                        .all(|&v| matches!(self.nodes[v], Node::Null)) =>
                {
                    Ok(())
                }
                _ => Err(YamlError::Invalid),
            },
        }
    }
}

/// Applies one whitespace repair at char index `at`; `None` when it does not apply
/// (the block then stays refused). Also returns the line index and count of spaces
/// put in front of a line, if that is what the repair did.
fn repair(text: &str, at: usize, kind: Repair) -> Option<(String, Option<(usize, usize)>)> {
    let b = text.char_indices().nth(at).map_or(text.len(), |(i, _)| i);
    match kind {
        Repair::TabAfterColon => {
            // saphyr stops at the first non-blank after the `:`.
            let gap_start = text[..b].trim_end_matches([' ', '\t']).len();
            if !text[..gap_start].ends_with(':') || !text[gap_start..b].contains('\t') {
                return None;
            }
            let gap = text[gap_start..b].replace('\t', " ");
            Some((format!("{}{gap}{}", &text[..gap_start], &text[b..]), None))
        }
        Repair::QuotedIndent => {
            let quote = text[b..].chars().next()?;
            let end = b + quoted_len(&text[b..], quote)?;
            let line_start = text[..b].rfind(['\n', '\r']).map_or(0, |i| i + 1);
            let pad = " ".repeat(text[line_start..b].chars().count());
            if pad.is_empty() {
                return None;
            }
            let mut out = String::with_capacity(text.len() + pad.len() * 4);
            out.push_str(&text[..b]);
            let mut rest = &text[b..end];
            // Indent every line that starts inside the scalar.
            while let Some(i) = rest.find(['\n', '\r']) {
                let brk = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                out.push_str(&rest[..i + brk]);
                rest = &rest[i + brk..];
                if starts_with_document_marker(rest) {
                    return None;
                }
                out.push_str(&pad);
            }
            out.push_str(rest);
            out.push_str(&text[end..]);
            Some((out, None))
        }
        Repair::SurrogatePair => {
            if !text[b..].starts_with('"') {
                return None;
            }
            let end = b + quoted_len(&text[b..], '"')?;
            let joined = join_surrogate_escapes(&text[b..end])?;
            Some((format!("{}{joined}{}", &text[..b], &text[end..]), None))
        }
        Repair::QuotedTab => {
            let line_start = text[..b].rfind(['\n', '\r']).map_or(0, |i| i + 1);
            let blanks =
                text[line_start..].len() - text[line_start..].trim_start_matches([' ', '\t']).len();
            let line_end = line_start + blanks;
            if b >= line_end || !text[line_start..line_end].contains('\t') {
                return None;
            }
            let spaces = " ".repeat(blanks);
            Some((
                format!("{}{spaces}{}", &text[..line_start], &text[line_end..]),
                None,
            ))
        }
        Repair::FlowIndent => {
            let line_start = text[..b].rfind(['\n', '\r']).map_or(0, |i| i + 1);
            let line = &text[line_start..];
            if starts_with_document_marker(line) {
                return None;
            }
            // Any block indent so far is at most the widest run of leading spaces and
            // block indicators of an earlier line, so one more column is enough.
            let needed = text[..line_start]
                .split(['\n', '\r'])
                .map(block_prefix_width)
                .max()
                .unwrap_or(0)
                + 1;
            let has = line.len() - line.trim_start_matches(' ').len();
            if has >= needed {
                return None;
            }
            let pad = " ".repeat(needed - has);
            let index = line_index(text, line_start);
            Some((
                format!("{}{pad}{line}", &text[..line_start]),
                Some((index, needed - has)),
            ))
        }
    }
}

/// The length in bytes of the quoted scalar at the start of `s` (`quote` is `'` or `"`),
/// or `None` when it is not closed.
fn quoted_len(s: &str, quote: char) -> Option<usize> {
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if quote == '"' => {
                chars.next();
            }
            '\'' if quote == '\'' && s[i + 1..].starts_with('\'') => {
                chars.next();
            }
            c if c == quote => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// The rest of a scalar's span after its anchor and tag (and the blanks and comments
/// around them).
fn skip_properties(raw: &str) -> &str {
    let mut rest = raw;
    loop {
        rest = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        if rest.starts_with('#') {
            rest = rest.find(['\n', '\r']).map_or("", |i| &rest[i..]);
        } else if rest.starts_with("!<") {
            rest = rest.find('>').map_or("", |i| &rest[i + 1..]);
        } else if rest.starts_with(['&', '!']) {
            let end = rest
                .find([' ', '\t', '\n', '\r', ',', '[', ']', '{', '}'])
                .unwrap_or(rest.len());
            rest = &rest[end..];
        } else {
            return rest;
        }
    }
}

/// Rewrites each `\uD8xx\uDCxx` pair in a double-quoted scalar as one `\U` escape;
/// `None` when there is none (a lone surrogate stays an error: Rust strings cannot hold
/// one).
fn join_surrogate_escapes(quoted: &str) -> Option<String> {
    let hex = |s: &str, at: usize| -> Option<u32> {
        let digits = s.get(at..at + 4)?;
        digits
            .bytes()
            .all(|c| c.is_ascii_hexdigit())
            .then(|| u32::from_str_radix(digits, 16).ok())
            .flatten()
    };
    let mut out = String::with_capacity(quoted.len());
    let mut joined = false;
    let mut rest = quoted;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let escape = &rest[i..];
        let pair = (escape.starts_with("\\u") && escape[6..].starts_with("\\u"))
            .then(|| Some((hex(escape, 2)?, hex(escape, 8)?)))
            .flatten()
            .filter(|(hi, lo)| (0xD800..0xDC00).contains(hi) && (0xDC00..0xE000).contains(lo));
        if let Some((hi, lo)) = pair {
            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
            out.push_str(&format!("\\U{c:08X}"));
            rest = &escape[12..];
            joined = true;
        } else {
            // Any other escape: copy the backslash and the character it escapes.
            let len = escape[1..].chars().next().map_or(1, |c| 1 + c.len_utf8());
            out.push_str(&escape[..len]);
            rest = &escape[len..];
        }
    }
    out.push_str(rest);
    joined.then_some(out)
}

/// The lines of `s`, split at LF, CRLF and lone CR as both parsers do.
fn lines(s: &str) -> impl Iterator<Item = &str> {
    s.split('\n')
        .flat_map(|l| l.strip_suffix('\r').unwrap_or(l).split('\r'))
}

/// The index of the line holding byte offset `at`: the line breaks before it, a CRLF
/// counting once.
fn line_index(text: &str, at: usize) -> usize {
    let b = text.as_bytes();
    (0..at.min(b.len()))
        .filter(|&i| b[i] == b'\n' || (b[i] == b'\r' && b.get(i + 1) != Some(&b'\n')))
        .count()
}

/// Whether a line starts with `---` or `...` followed by a blank or its end.
fn starts_with_document_marker(line: &str) -> bool {
    (line.starts_with("---") || line.starts_with("..."))
        && line[3..]
            .chars()
            .next()
            .is_none_or(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

/// The column after a line's leading spaces and block indicators (`- `, `? `, `: `).
fn block_prefix_width(line: &str) -> usize {
    let mut rest = line;
    loop {
        let trimmed = rest.trim_start_matches(' ');
        match trimmed.as_bytes() {
            [b'-' | b'?' | b':', b' ', ..] => rest = &trimmed[2..],
            _ => return line.len() - trimmed.len(),
        }
    }
}

/// The prefix of js-yaml's own tags (`!!x` is `tag:yaml.org,2002:x`).
const CORE: &str = "tag:yaml.org,2002:";

/// The tag as js-yaml spells it: `!!str` is `tag:yaml.org,2002:str`, `!foo` is `!foo`,
/// the non-specific `!` is `!`, a verbatim `!<x>` is `x`.
fn tag_name(tag: &Tag) -> String {
    format!("{}{}", tag.handle, tag.suffix)
}

/// The key and value of an object with exactly one own key (`!!omap`, `!!pairs`).
fn single_pair(nodes: &[Node], id: NodeId) -> Loaded<(&str, NodeId)> {
    match &nodes[id] {
        Node::Object(entries) if entries.len() == 1 => entries
            .iter()
            .next()
            .map(|(k, &v)| (k.as_str(), v))
            .ok_or(YamlError::Invalid),
        _ => Err(YamlError::Invalid),
    }
}

/// js-yaml `storeMappingPair`: stringify the key, then merge or set it.
fn store_pair(
    nodes: &mut Vec<Node>,
    work: &mut Work,
    map: NodeId,
    overridable: &mut HashSet<String>,
    key: NodeId,
    is_merge: bool,
    value: NodeId,
) -> Loaded<()> {
    let key = key_string(nodes, work, key)?;
    if is_merge {
        let sources = match &nodes[value] {
            Node::Array(items) => items.clone(),
            _ => vec![value],
        };
        for source in sources {
            merge_from(nodes, work, map, overridable, source)?;
        }
        return Ok(());
    }
    let Node::Object(entries) = &mut nodes[map] else {
        return Err(YamlError::Invalid);
    };
    if entries.contains_key(&key) && !overridable.contains(&key) {
        // js-yaml throws "duplicated mapping key".
        return Err(YamlError::Invalid);
    }
    overridable.remove(&key);
    entries.insert(key, value);
    Ok(())
}

/// js-yaml `mergeMappings`: copies the own keys of `source` that `map` lacks. Any
/// non-null object may be a source (arrays and byte arrays give their indices).
fn merge_from(
    nodes: &mut Vec<Node>,
    work: &mut Work,
    map: NodeId,
    overridable: &mut HashSet<String>,
    source: NodeId,
) -> Loaded<()> {
    let pairs: Vec<(String, NodeId)> = match &nodes[source] {
        Node::Object(entries) => entries.iter().map(|(k, &v)| (k.clone(), v)).collect(),
        Node::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, &v)| (i.to_string(), v))
            .collect(),
        Node::Bytes(bytes) => {
            let bytes = bytes.clone();
            work.spend(bytes.len())?;
            bytes
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    nodes.push(Node::Number(f64::from(b)));
                    (i.to_string(), nodes.len() - 1)
                })
                .collect()
        }
        Node::Date(_) => Vec::new(),
        _ => return Err(YamlError::Invalid),
    };
    work.spend(pairs.len())?;
    let Node::Object(entries) = &mut nodes[map] else {
        return Err(YamlError::Invalid);
    };
    for (key, value) in pairs {
        if let Entry::Vacant(slot) = entries.entry(key) {
            overridable.insert(slot.key().clone());
            slot.insert(value);
        }
    }
    Ok(())
}

/// `String(key)` as js-yaml computes it: plain objects become `[object Object]` (also as
/// array elements, so an own `toString` never runs), arrays inside array keys are errors.
fn key_string(nodes: &[Node], work: &mut Work, id: NodeId) -> Loaded<String> {
    let mut out = String::new();
    match &nodes[id] {
        Node::Array(items) => {
            for (i, &item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let piece = match &nodes[item] {
                    Node::Array(_) => return Err(YamlError::Invalid),
                    Node::Object(_) => "[object Object]".to_owned(),
                    // join() prints null elements as "".
                    Node::Null => String::new(),
                    leaf => leaf_string(leaf),
                };
                // Aliases can repeat a long string many times in one key.
                work.spend(piece.len())?;
                out.push_str(&piece);
            }
        }
        Node::Object(_) => out.push_str("[object Object]"),
        leaf => out.push_str(&leaf_string(leaf)),
    }
    Ok(out)
}

/// `String()` of a value that is not an array or object.
fn leaf_string(node: &Node) -> String {
    let value = match node {
        Node::Null => FmValue::Null,
        Node::Bool(b) => FmValue::Bool(*b),
        Node::Number(n) => FmValue::Number(*n),
        Node::Str(s) => return s.clone(),
        Node::Date(t) => FmValue::Date(*t),
        Node::Bytes(b) => FmValue::Bytes(b.clone()),
        Node::Array(_) | Node::Object(_) => FmValue::Object {
            has_own_to_string: false,
        },
    };
    // Leaves never throw.
    value.js_string().unwrap_or_default()
}

/// Converts the title node. Shared nodes are expanded (within the budget); an array that
/// contains itself is printed as "" by V8's `join`, which `Null` reproduces; arrays past
/// [`MAX_STRING_DEPTH`] are cut off one level down, deep enough for `String()` to throw.
/// Iterative, so deep values cost no stack.
fn to_fm(nodes: &[Node], work: &mut Work, title: NodeId) -> Loaded<FmValue> {
    // The arrays being converted, outermost first, with their elements so far.
    let mut open: Vec<(NodeId, Vec<FmValue>)> = Vec::new();
    let mut next = title;
    loop {
        work.spend(1)?;
        let mut finished = match &nodes[next] {
            Node::Array(_) if open.iter().any(|&(id, _)| id == next) => Some(FmValue::Null),
            Node::Array(_) if open.len() > MAX_STRING_DEPTH => Some(FmValue::Array(Vec::new())),
            Node::Array(_) => {
                open.push((next, Vec::new()));
                None
            }
            Node::Null => Some(FmValue::Null),
            Node::Bool(b) => Some(FmValue::Bool(*b)),
            Node::Number(n) => Some(FmValue::Number(*n)),
            Node::Str(s) => {
                work.spend(s.len())?;
                Some(FmValue::String(s.clone()))
            }
            Node::Date(t) => Some(FmValue::Date(*t)),
            Node::Bytes(b) => {
                work.spend(b.len())?;
                Some(FmValue::Bytes(b.clone()))
            }
            Node::Object(entries) => Some(FmValue::Object {
                has_own_to_string: entries.contains_key("toString"),
            }),
        };
        loop {
            let Some((id, items)) = open.last_mut() else {
                return finished.ok_or(YamlError::Invalid);
            };
            items.extend(finished.take());
            let Node::Array(all) = &nodes[*id] else {
                return Err(YamlError::Invalid);
            };
            if let Some(&child) = all.get(items.len()) {
                next = child;
                break;
            }
            let Some((_, items)) = open.pop() else {
                return Err(YamlError::Invalid);
            };
            finished = Some(FmValue::Array(items));
        }
    }
}

/// Types a scalar as js-yaml's default schema does; the flag marks a merge key (`<<`).
fn scalar(value: &str, style: ScalarStyle, tag: Option<&str>) -> Loaded<(Node, bool)> {
    // An empty plain scalar is a node without content: js-yaml's `null` data.
    let data = (style != ScalarStyle::Plain || !value.is_empty()).then_some(value);
    Ok(match (tag, data) {
        (None | Some("!"), None) => (Node::Null, false),
        (None, Some(d)) if style == ScalarStyle::Plain => implicit(d),
        // Quoted and block scalars, and the non-specific tag, are never resolved.
        (None | Some("!"), Some(d)) => (Node::Str(d.to_owned()), false),
        // The verbatim `!<?>` asks for implicit resolution of any scalar.
        (Some("?"), None) => (Node::Null, false),
        (Some("?"), Some(d)) => implicit(d),
        (Some(t), data) => (explicit(t, data)?, t == "tag:yaml.org,2002:merge"),
    })
}

/// js-yaml's implicit types, in its order: null, bool, int, float, timestamp, merge.
fn implicit(d: &str) -> (Node, bool) {
    let node = if is_null(d) {
        Node::Null
    } else if let Some(b) = bool_value(d) {
        Node::Bool(b)
    } else if let Some(n) = int_value(d).or_else(|| float_value(d)) {
        Node::Number(n)
    } else if let Some(t) = timestamp_value(d) {
        Node::Date(t)
    } else {
        return (Node::Str(d.to_owned()), d == "<<");
    };
    (node, false)
}

/// An explicitly tagged scalar; `data` is `None` for a node without content.
fn explicit(tag: &str, data: Option<&str>) -> Loaded<Node> {
    let Some(name) = tag.strip_prefix(CORE) else {
        // Local and foreign tags are unknown to the default schema.
        return Err(YamlError::Invalid);
    };
    let node = match (name, data) {
        ("str", d) => Node::Str(d.unwrap_or_default().to_owned()),
        ("null", None) => Node::Null,
        ("null", Some(d)) if is_null(d) => Node::Null,
        ("bool", Some(d)) => Node::Bool(bool_value(d).ok_or(YamlError::Invalid)?),
        ("int", Some(d)) => Node::Number(int_value(d).ok_or(YamlError::Invalid)?),
        ("float", Some(d)) => Node::Number(float_value(d).ok_or(YamlError::Invalid)?),
        ("timestamp", Some(d)) => Node::Date(timestamp_value(d).ok_or(YamlError::Invalid)?),
        ("binary", Some(d)) => Node::Bytes(binary_value(d).ok_or(YamlError::Invalid)?),
        ("merge", None) => Node::Null,
        ("merge", Some("<<")) => Node::Str("<<".to_owned()),
        // Collection tags on a node without content construct an empty collection.
        ("seq" | "omap" | "pairs", None) => Node::Array(Vec::new()),
        ("map" | "set", None) => Node::Object(HashMap::new()),
        _ => return Err(YamlError::Invalid),
    };
    Ok(node)
}

/// js-yaml null: `~`, `null`, `Null`, `NULL` (the empty node is handled by the caller).
fn is_null(d: &str) -> bool {
    matches!(d, "~" | "null" | "Null" | "NULL")
}

/// js-yaml bool: only the three spellings of `true` and `false` (YAML 1.1 `yes`/`on`
/// stay strings).
fn bool_value(d: &str) -> Option<bool> {
    match d {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// js-yaml int (`resolveYamlInteger` + `constructYamlInteger`): decimal with optional
/// sign and leading zeros, `0b`, `0o`, `0x`, `_` separators anywhere but first or last.
fn int_value(d: &str) -> Option<f64> {
    let b = d.as_bytes();
    let (negative, unsigned) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    let radix_digits = |rest: &[u8], valid: fn(u8) -> bool| -> Option<()> {
        let digits = rest.iter().filter(|&&c| c != b'_');
        (digits.clone().next().is_some() && digits.clone().all(|&c| valid(c)))
            .then_some(())
            .filter(|()| rest.last() != Some(&b'_'))
    };
    let clean: Vec<u8> = unsigned.iter().copied().filter(|&c| c != b'_').collect();
    let magnitude = match unsigned {
        [b'0'] => return Some(0.0),
        [b'0', b'b', rest @ ..] => {
            radix_digits(rest, |c| matches!(c, b'0' | b'1'))?;
            pow2_radix_value(&clean[2..], 1)
        }
        [b'0', b'o', rest @ ..] => {
            radix_digits(rest, |c| matches!(c, b'0'..=b'7'))?;
            pow2_radix_value(&clean[2..], 3)
        }
        [b'0', b'x', rest @ ..] => {
            radix_digits(rest, |c: u8| c.is_ascii_hexdigit())?;
            pow2_radix_value(&clean[2..], 4)
        }
        _ => {
            // A `0` followed by `_` fails here too, as in js-yaml.
            let first_after_zero = if unsigned.first() == Some(&b'0') {
                1
            } else {
                0
            };
            if unsigned.get(first_after_zero) == Some(&b'_') {
                return None;
            }
            radix_digits(unsigned, |c| c.is_ascii_digit())?;
            // Digits only, so this parse cannot fail; it rounds like parseInt.
            std::str::from_utf8(&clean).ok()?.parse::<f64>().ok()?
        }
    };
    // "-0" alone is +0 in js-yaml; other zeros keep the sign of `sign * parseInt()`.
    Some(if negative { -magnitude } else { magnitude })
}

/// `parseInt` for radix 2, 8 or 16 (`bits` per digit): exact, then rounded to nearest,
/// ties to even, as V8 does.
fn pow2_radix_value(digits: &[u8], bits: u32) -> f64 {
    let mut mantissa: u64 = 0;
    let mut significant = 0_u32;
    let mut dropped = 0_u64;
    let (mut half, mut sticky) = (false, false);
    for &c in digits {
        let v = char::from(c).to_digit(16).unwrap_or(0);
        for k in (0..bits).rev() {
            let bit = (v >> k) & 1 == 1;
            if significant == 0 && !bit {
                continue;
            }
            if significant < 53 {
                mantissa = (mantissa << 1) | u64::from(bit);
                significant += 1;
            } else {
                if dropped == 0 {
                    half = bit;
                } else {
                    sticky |= bit;
                }
                dropped = dropped.saturating_add(1);
            }
        }
    }
    if half && (sticky || mantissa & 1 == 1) {
        mantissa += 1;
        if mantissa == 1 << 53 {
            mantissa >>= 1;
            dropped = dropped.saturating_add(1);
        }
    }
    if mantissa == 0 {
        return 0.0;
    }
    // Past 2^1024 the value is Infinity; powi of a power of two is exact below that.
    let exponent = i32::try_from(dropped.min(2000)).unwrap_or(2000);
    mantissa as f64 * 2f64.powi(exponent)
}

/// js-yaml float (`YAML_FLOAT_PATTERN` + `constructYamlFloat`).
fn float_value(d: &str) -> Option<f64> {
    if !is_yaml_float(d.as_bytes()) || d.ends_with('_') {
        return None;
    }
    let value: String = d
        .chars()
        .filter(|&c| c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let (sign, unsigned) = match value.as_bytes().first() {
        Some(b'-') => (-1.0, &value[1..]),
        Some(b'+') => (1.0, &value[1..]),
        _ => (1.0, value.as_str()),
    };
    Some(match unsigned {
        ".inf" => sign * f64::INFINITY,
        ".nan" => f64::NAN,
        _ => sign * parse_float(unsigned),
    })
}

/// Whether `d` matches js-yaml's `YAML_FLOAT_PATTERN` in full.
fn is_yaml_float(d: &[u8]) -> bool {
    let digits_or_underscores = |s: &[u8]| {
        s.iter()
            .take_while(|c| c.is_ascii_digit() || **c == b'_')
            .count()
    };
    // `([eE][-+]?[0-9]+)?` then the end.
    let exponent_to_end = |s: &[u8]| match s {
        [] => true,
        [b'e' | b'E', rest @ ..] => {
            let rest = rest
                .strip_prefix(b"-")
                .or_else(|| rest.strip_prefix(b"+"))
                .unwrap_or(rest);
            !rest.is_empty() && rest.iter().all(u8::is_ascii_digit)
        }
        _ => false,
    };
    let unsigned = match d {
        [b'-' | b'+', rest @ ..] => rest,
        _ => d,
    };
    match unsigned {
        // `[-+]?[0-9][0-9_]*(\.[0-9_]*)?` + exponent
        [c, ..] if c.is_ascii_digit() => {
            let mut rest = &unsigned[1 + digits_or_underscores(&unsigned[1..])..];
            if let [b'.', after @ ..] = rest {
                rest = &after[digits_or_underscores(after)..];
            }
            exponent_to_end(rest)
        }
        [b'.', rest @ ..] => {
            let signed = unsigned.len() != d.len();
            match rest {
                b"inf" | b"Inf" | b"INF" => true,
                b"nan" | b"NaN" | b"NAN" => !signed,
                // `\.[0-9_]+` + exponent, unsigned only
                _ => {
                    let n = digits_or_underscores(rest);
                    !signed && n > 0 && exponent_to_end(&rest[n..])
                }
            }
        }
        _ => false,
    }
}

/// JavaScript `parseFloat` of an unsigned, lower-case decimal that `is_yaml_float`
/// accepted: the longest decimal prefix, NaN when it has no digit (`.e5`).
fn parse_float(s: &str) -> f64 {
    let b = s.as_bytes();
    let int_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = int_len;
    let mut frac_len = 0;
    if b.get(end) == Some(&b'.') {
        frac_len = b[end + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        end += 1 + frac_len;
    }
    if int_len == 0 && frac_len == 0 {
        return f64::NAN;
    }
    let int = &s[..int_len];
    let frac = s[int_len..end].trim_start_matches('.');
    let exponent = match &b[end..] {
        [b'e', rest @ ..] => {
            let sign_len = usize::from(matches!(rest.first(), Some(b'-' | b'+')));
            let n = rest[sign_len..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if n > 0 {
                &s[end + 1..end + 1 + sign_len + n]
            } else {
                "0"
            }
        }
        _ => "0",
    };
    let int = if int.is_empty() { "0" } else { int };
    let frac = if frac.is_empty() { "0" } else { frac };
    format!("{int}.{frac}e{exponent}")
        .parse::<f64>()
        .unwrap_or(f64::NAN)
}

/// js-yaml timestamp: `YYYY-MM-DD`, or the YAML 1.1 date-time form with `T`, `t` or
/// spaces/tabs before the time, an optional fraction and an optional `Z` or offset.
/// The fields go through `Date.UTC`, so out-of-range values carry over.
fn timestamp_value(d: &str) -> Option<f64> {
    let b = d.as_bytes();
    let mut p = 0;
    let year = digits(b, &mut p, 4, 4)?;
    eat(b, &mut p, b'-')?;
    let month_start = p;
    let month = digits(b, &mut p, 1, 2)?;
    let short_month = p - month_start == 1;
    eat(b, &mut p, b'-')?;
    let day_start = p;
    let day = digits(b, &mut p, 1, 2)?;
    if p == b.len() {
        // The date-only form wants two-digit month and day.
        return (!short_month && p - day_start == 2)
            .then(|| date_utc(year, month - 1, day, 0, 0, 0, 0));
    }
    match b.get(p)? {
        b'T' | b't' => p += 1,
        b' ' | b'\t' => {
            while matches!(b.get(p), Some(b' ' | b'\t')) {
                p += 1;
            }
        }
        _ => return None,
    }
    let hour = digits(b, &mut p, 1, 2)?;
    eat(b, &mut p, b':')?;
    let minute = digits(b, &mut p, 2, 2)?;
    eat(b, &mut p, b':')?;
    let second = digits(b, &mut p, 2, 2)?;
    let mut ms = 0;
    if b.get(p) == Some(&b'.') {
        p += 1;
        let start = p;
        while b.get(p).is_some_and(u8::is_ascii_digit) {
            p += 1;
        }
        // Milliseconds: the first three digits, padded on the right.
        let mut fraction = b[start..p.min(start + 3)].to_vec();
        fraction.resize(3, b'0');
        let mut q = 0;
        ms = digits(&fraction, &mut q, 3, 3)?;
    }
    let mut offset_minutes = 0;
    if p < b.len() {
        while matches!(b.get(p), Some(b' ' | b'\t')) {
            p += 1;
        }
        match b.get(p)? {
            b'Z' => p += 1,
            sign @ (b'+' | b'-') => {
                let negative = *sign == b'-';
                p += 1;
                let tz_hour = digits(b, &mut p, 1, 2)?;
                let tz_minute = if b.get(p) == Some(&b':') {
                    p += 1;
                    digits(b, &mut p, 2, 2)?
                } else {
                    0
                };
                offset_minutes = tz_hour * 60 + tz_minute;
                if negative {
                    offset_minutes = -offset_minutes;
                }
            }
            _ => return None,
        }
        if p != b.len() {
            return None;
        }
    }
    let t = date_utc(year, month - 1, day, hour, minute, second, ms);
    Some(time_clip(t - (offset_minutes * 60_000) as f64))
}

/// Reads `min..=max` ASCII digits at `*p` (greedy, as the regex is) as a number.
fn digits(b: &[u8], p: &mut usize, min: usize, max: usize) -> Option<i64> {
    let start = *p;
    let mut value = 0_i64;
    while *p - start < max {
        match b.get(*p) {
            Some(c) if c.is_ascii_digit() => {
                value = value * 10 + i64::from(c - b'0');
                *p += 1;
            }
            _ => break,
        }
    }
    (*p - start >= min).then_some(value)
}

/// Consumes `c` at `*p`.
fn eat(b: &[u8], p: &mut usize, c: u8) -> Option<()> {
    (b.get(*p) == Some(&c)).then(|| *p += 1)
}

/// js-yaml's base64 alphabet; `=` counts as six bits when resolving.
const BASE64: &[u8; 65] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";

/// js-yaml `!!binary` (`resolveYamlBinary` + `constructYamlBinary`), quirks included:
/// CR and LF are skipped, `=` may appear anywhere, a lone trailing character is dropped.
fn binary_value(d: &str) -> Option<Vec<u8>> {
    let mut bit_len = 0_usize;
    for c in d.bytes() {
        if c == b'\r' || c == b'\n' {
            continue;
        }
        if !BASE64.contains(&c) {
            return None;
        }
        bit_len += 6;
    }
    if !bit_len.is_multiple_of(8) {
        return None;
    }
    let input: Vec<u32> = d
        .bytes()
        .filter(|c| !matches!(c, b'\r' | b'\n' | b'='))
        .filter_map(|c| BASE64.iter().position(|&a| a == c))
        .filter_map(|i| u32::try_from(i).ok())
        .collect();
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut bits: u32 = 0;
    for (i, &v) in input.iter().enumerate() {
        if i % 4 == 0 && i > 0 {
            out.extend_from_slice(&[(bits >> 16) as u8, (bits >> 8) as u8, bits as u8]);
        }
        bits = (bits << 6) | v;
    }
    match input.len() % 4 {
        0 if !input.is_empty() => {
            out.extend_from_slice(&[(bits >> 16) as u8, (bits >> 8) as u8, bits as u8]);
        }
        0 => out.extend_from_slice(&[0, 0, 0]),
        3 => out.extend_from_slice(&[(bits >> 10) as u8, (bits >> 2) as u8]),
        2 => out.push((bits >> 4) as u8),
        _ => {}
    }
    Some(out)
}

/// Char indices of the characters js-yaml refuses inside scalars. It accepts them in
/// comments, so they are checked against scalar spans, not the whole block.
#[derive(Debug, Default)]
struct Unprintable {
    /// C0 controls other than TAB, LF and CR: refused in every scalar style.
    controls: Vec<usize>,
    /// DEL, C1 controls other than NEL, U+FFFE, U+FFFF: refused in plain and block
    /// scalars only (js-yaml checks quoted scalars with its JSON rule instead).
    others: Vec<usize>,
}

impl Unprintable {
    fn find(block: &str) -> Unprintable {
        let mut found = Unprintable::default();
        for (i, c) in block.chars().enumerate() {
            match c {
                '\u{0}'..='\u{8}' | '\u{B}' | '\u{C}' | '\u{E}'..='\u{1F}' => {
                    found.controls.push(i)
                }
                '\u{7F}'..='\u{84}' | '\u{86}'..='\u{9F}' | '\u{FFFE}' | '\u{FFFF}' => {
                    found.others.push(i);
                }
                _ => {}
            }
        }
        found
    }

    /// Whether a scalar of `style` between char indices `start` and `end` holds a
    /// refused character.
    fn inside(&self, start: usize, end: usize, style: ScalarStyle) -> bool {
        let quoted = matches!(style, ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted);
        let hit = |positions: &[usize]| {
            let first = positions.partition_point(|&i| i < start);
            positions.get(first).is_some_and(|&i| i < end)
        };
        hit(&self.controls) || (!quoted && hit(&self.others))
    }
}

#[cfg(test)]
// A failed expectation in a test should panic with its message.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    /// The title of a raw file as the gateway computes it.
    fn title_of(raw: &str) -> Option<String> {
        split_raw(raw)
            .0
            .title_string()
            .expect("String() does not throw")
    }

    /// The title of a YAML block.
    fn yaml_title(block: &str) -> Option<String> {
        title_of(&format!("---\n{block}\n---\n"))
    }

    fn fm_title(block: &str) -> Option<FmValue> {
        split_raw(&format!("---\n{block}\n---\n")).0.title
    }

    #[test]
    fn split_matches_the_gateway_regex() {
        assert_eq!(
            split("---\ntitle: A\n---\nbody"),
            Some(("title: A", "body"))
        );
        assert_eq!(
            split("---\r\ntitle: A\r\n---\r\nbody\r\n"),
            Some(("title: A", "body\r\n"))
        );
        // Mixed line breaks are fine too.
        assert_eq!(split("---\r\na\n---\r\nb"), Some(("a", "b")));
        // The closer must be followed by a line break.
        assert_eq!(split("---\ntitle: A\n---"), None);
        assert_eq!(split("---\ntitle: A\n---\r"), None);
        // No trailing space after either fence, no BOM, no empty block without a line.
        assert_eq!(split("--- \ntitle: A\n---\nb"), None);
        assert_eq!(split("---\ntitle: A\n--- \nb"), None);
        assert_eq!(split("\u{FEFF}---\ntitle: A\n---\nb"), None);
        assert_eq!(split("---\n---\nbody"), None);
        assert_eq!(split("---\n\n---\nbody"), Some(("", "body")));
        // `----` is not a closer; the shortest block wins.
        assert_eq!(
            split("---\na\n----\nb\n---\nc\n---\nd"),
            Some(("a\n----\nb", "c\n---\nd"))
        );
        assert_eq!(split("---\n---\n---\nb"), Some(("---", "b")));
        assert_eq!(split("---\na\r\n---\n"), Some(("a", "")));
        assert_eq!(split(" ---\na\n---\n"), None);
        assert_eq!(split("---"), None);
        assert_eq!(split(""), None);
    }

    #[test]
    fn split_raw_bodies() {
        let (fm, body) = split_raw(
            "---\ntitle: Raw Source\napi_key: must-not-appear\n---\n\n# Visible\n\nText. \n\n",
        );
        assert_eq!(fm.title, Some(FmValue::String("Raw Source".into())));
        assert_eq!(fm.project, None);
        assert!(!format!("{fm:?}").contains("must-not-appear"));
        // Leading whitespace of the body is kept, trailing (JS set) removed.
        assert_eq!(body, "\n# Visible\n\nText.");
        let (fm, body) = split_raw("  # No frontmatter \u{3000}\n\u{FEFF}");
        assert_eq!(fm, Frontmatter::default());
        assert_eq!(body, "  # No frontmatter");
        let (fm, body) = split_raw("---\ntitle: A\n---");
        assert_eq!(fm, Frontmatter::default());
        assert_eq!(body, "---\ntitle: A\n---");
        // U+0085 is not JavaScript whitespace.
        assert_eq!(split_raw("---\na: 1\n---\n x\u{85}\n").1, " x\u{85}");
        // A CRLF file.
        let (fm, body) = split_raw("---\r\ntitle: Win\r\n---\r\n# H\r\n");
        assert_eq!(fm.title, Some(FmValue::String("Win".into())));
        assert_eq!(body, "# H");
    }

    #[test]
    fn project_is_never_read_from_raw_files() {
        let (fm, _) = split_raw("---\ntitle: T\nproject: secret\n---\n");
        assert_eq!(fm.project, None);
    }

    #[test]
    fn plain_scalars_are_typed_like_js_yaml() {
        let cases: &[(&str, Option<&str>)] = &[
            ("title: Hello world", Some("Hello world")),
            ("title: 012", Some("12")),
            ("title: 1_000", Some("1000")),
            ("title: .inf", Some("Infinity")),
            ("title: -.Inf", Some("-Infinity")),
            ("title: +.INF", Some("Infinity")),
            ("title: .NaN", Some("NaN")),
            ("title: .nan", Some("NaN")),
            ("title: -.nan", Some("-.nan")),
            ("title: 0x1A", Some("26")),
            ("title: -0x1A", Some("-26")),
            ("title: 0X1A", Some("0X1A")),
            ("title: 0o17", Some("15")),
            ("title: 0b101", Some("5")),
            ("title: 0b", Some("0b")),
            ("title: 0b_1", Some("1")),
            ("title: 0x_", Some("0x_")),
            ("title: 1_", Some("1_")),
            ("title: _1", Some("_1")),
            ("title: 0_1", Some("1")),
            ("title: 42", Some("42")),
            ("title: -0", Some("0")),
            ("title: +12", Some("12")),
            ("title: 1.0", Some("1")),
            ("title: 1.5", Some("1.5")),
            ("title: 1e3", Some("1000")),
            ("title: 1E3", Some("1000")),
            ("title: 1_0.5", Some("10.5")),
            ("title: .5", Some("0.5")),
            ("title: -.5", Some("-.5")),
            ("title: 1.", Some("1")),
            ("title: 1.e2", Some("100")),
            ("title: ._e5", Some("NaN")),
            ("title: 1e", Some("1e")),
            ("title: 1e400", Some("Infinity")),
            ("title: 1e21", Some("1e+21")),
            ("title: 12345678901234567890", Some("12345678901234567000")),
            ("title: 0x1FFFFFFFFFFFFF", Some("9007199254740991")),
            ("title: 0x20000000000001", Some("9007199254740992")),
            ("title: 0x20000000000003", Some("9007199254740996")),
            ("title: 0x20000000000002_1", Some("144115188075855900")),
            ("title: yes", Some("yes")),
            ("title: no", Some("no")),
            ("title: on", Some("on")),
            ("title: true", Some("true")),
            ("title: FALSE", Some("false")),
            ("title: tRUE", Some("tRUE")),
            ("title: ~", None),
            ("title: null", None),
            ("title: NULL", None),
            ("title: nULL", Some("nULL")),
            ("title:", None),
            ("title: '012'", Some("012")),
            ("title: \"1_000\"", Some("1_000")),
            ("title: 'true'", Some("true")),
            ("title: '~'", Some("~")),
            ("title: ''", None),
            ("title: \"  \"", None),
            ("title: <<", Some("<<")),
            ("title: [a, b]", Some("a,b")),
            ("title:\n  - a\n  - b", Some("a,b")),
            ("title: [a, [b, ~, [c]], ~]", Some("a,b,,c,")),
            ("title: [~]", None),
            ("title: []", None),
            ("title: {}", Some("[object Object]")),
            ("title: {a: 1}", Some("[object Object]")),
            (
                "title: |\n  line one\n  line two",
                Some("line one\nline two"),
            ),
            ("title: >\n  folded\n  text", Some("folded text")),
            ("title: \"esc\\tape \\u00e9\"", Some("esc\tape é")),
            ("title: 'it''s'", Some("it's")),
            ("title: plain\n  continued", Some("plain continued")),
            ("title: a # comment", Some("a")),
        ];
        for (block, want) in cases {
            assert_eq!(yaml_title(block).as_deref(), *want, "{block:?}");
        }
    }

    #[test]
    fn timestamps_become_utc_dates() {
        let cases: &[(&str, &str)] = &[
            (
                "2024-01-01",
                "Mon Jan 01 2024 00:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2024-01-01T10:00:00Z",
                "Mon Jan 01 2024 10:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2001-12-14t21:59:43.10-05:00",
                "Sat Dec 15 2001 02:59:43 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2001-12-14 21:59:43.10 -5",
                "Sat Dec 15 2001 02:59:43 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2001-12-15 2:59:43.10",
                "Sat Dec 15 2001 02:59:43 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2001-1-5 2:59:43",
                "Fri Jan 05 2001 02:59:43 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2024-01-01T10:00:00.Z",
                "Mon Jan 01 2024 10:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2024-01-01T10:00:00+01:30",
                "Mon Jan 01 2024 08:30:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "0050-01-01",
                "Sun Jan 01 1950 00:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2024-99-99",
                "Mon Jun 07 2032 00:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "9999-12-31T99:99:99.9999-99:99",
                "Sat Jan 08 10000 09:19:39 GMT+0000 (Coordinated Universal Time)",
            ),
            (
                "2024-02-29",
                "Thu Feb 29 2024 00:00:00 GMT+0000 (Coordinated Universal Time)",
            ),
        ];
        for (ts, want) in cases {
            assert_eq!(
                yaml_title(&format!("title: {ts}")).as_deref(),
                Some(*want),
                "{ts}"
            );
        }
        for not_ts in [
            "2024-1-01",
            "2024-01-01T10:00",
            "2024-01-01 10:00:00 Z0",
            "2024-01-01T10:00:00z",
            "24-01-01",
            "2024-01-01T10:00:00+123",
        ] {
            assert_eq!(
                yaml_title(&format!("title: {not_ts}")).as_deref(),
                Some(not_ts),
                "{not_ts}"
            );
        }
        assert_eq!(
            yaml_title("title: '2024-01-01'").as_deref(),
            Some("2024-01-01")
        );
        assert_eq!(
            fm_title("title: !!timestamp 2024-01-01"),
            Some(FmValue::Date(1_704_067_200_000.0))
        );
    }

    #[test]
    fn explicit_tags() {
        let cases: &[(&str, Option<&str>)] = &[
            ("title: !!binary aGk=", Some("104,105")),
            (
                "title: !!binary |\n  aGVs\n  bG8=",
                Some("104,101,108,108,111"),
            ),
            ("title: !!binary aG=k", Some("104,105")),
            ("title: !!binary a===", None),
            ("title: !!str 012", Some("012")),
            ("title: !!str", None),
            ("title: !!str true", Some("true")),
            ("title: !!int '0x1A'", Some("26")),
            ("title: !!int \"012\"", Some("12")),
            ("title: !!float 1", Some("1")),
            ("title: !!float '1e3'", Some("1000")),
            ("title: !!bool \"TRUE\"", Some("true")),
            ("title: !!null '~'", None),
            ("title: !!null", None),
            ("title: ! 12", Some("12")),
            ("title: ! true", Some("true")),
            ("title: !<tag:yaml.org,2002:str> 12", Some("12")),
            ("title: !!seq [a, b]", Some("a,b")),
            ("title: !!seq", None),
            ("title: !!map {a: 1}", Some("[object Object]")),
            ("title: !!map", Some("[object Object]")),
            ("title: !!set {a, b}", Some("[object Object]")),
            (
                "title: !!omap [a: 1, b: 2]",
                Some("[object Object],[object Object]"),
            ),
            ("title: !!pairs [a: 1, b: 2, a: 3]", Some("a,1,b,2,a,3")),
            ("title: !!pairs", None),
            ("title: !!merge <<", Some("<<")),
            // `--- ` with a trailing space does not close the frontmatter.
            (
                "%TAG !e! tag:yaml.org,2002:\n--- \ntitle: !e!str 5",
                Some("5"),
            ),
        ];
        for (block, want) in cases {
            assert_eq!(yaml_title(block).as_deref(), *want, "{block:?}");
        }
    }

    #[test]
    fn bad_explicit_tags_discard_the_whole_block() {
        for block in [
            "title: ok\nother: !foo bar",
            "title: ok\nother: !!python/object x",
            "title: !!int abc",
            "title: !!int",
            "title: !!float x",
            "title: !!bool yes",
            "title: !!null ''",
            "title: !!null x",
            "title: !!binary a=",
            "title: !!binary 'a b c d'",
            "title: !!binary é",
            "title: !!timestamp 2024",
            "title: !!str [a]",
            "title: !!seq {a: 1}",
            "title: !!map [a]",
            "title: !!set {a: 1}",
            "title: !!omap [a, b]",
            "title: !!omap [a: 1, a: 2]",
            "title: !!omap [{a: 1, b: 2}]",
            "title: !!pairs [a]",
            "title: !!seq x",
            "title: !!merge x",
            "title: !<?> [a]",
        ] {
            assert_eq!(fm_title(block), None, "{block:?}");
        }
    }

    #[test]
    fn title_not_null_rules() {
        assert_eq!(fm_title("title: ~"), Some(FmValue::Null));
        assert_eq!(yaml_title("title: ~"), None);
        assert_eq!(yaml_title("other: x"), None);
        assert_eq!(yaml_title("title: 0"), Some("0".into()));
        assert_eq!(yaml_title("title: false"), Some("false".into()));
    }

    #[test]
    fn to_string_objects_throw() {
        for block in [
            "title: {toString: x}",
            "title: [a, {toString: 1}]",
            "title: [[a, [{toString: ~}]]]",
            "title: !!set {toString}",
            "base: &b {toString: 1}\ntitle: {<<: *b}",
            "title: {? toString}",
        ] {
            let (fm, _) = split_raw(&format!("---\n{block}\n---\n"));
            assert!(fm.title_string().is_err(), "{block:?}");
        }
        // As a key of a key, toString is harmless: keys are stringified without it.
        assert_eq!(
            yaml_title("? {toString: 1}\n: x\ntitle: ok"),
            Some("ok".into())
        );
    }

    #[test]
    fn non_mapping_results_have_no_title() {
        for block in [
            "- title: a",
            "title",
            "'title: x'",
            "2024-01-01",
            "!!binary aGk=",
            "!!omap [title: x]",
            "",
            "# only a comment",
            "~",
        ] {
            assert_eq!(fm_title(block), None, "{block:?}");
        }
        assert_eq!(yaml_title("!!map {title: x}"), Some("x".into()));
        assert_eq!(yaml_title("!!set {title}"), None);
        assert_eq!(yaml_title("{title: flow}"), Some("flow".into()));
        assert_eq!(yaml_title("\u{FEFF}title: bom"), Some("bom".into()));
    }

    #[test]
    fn syntax_errors_and_multiple_documents_give_no_title() {
        for block in [
            "title: [unclosed",
            "title: \"unclosed",
            "title: a\n  b: c",
            "title: a\nbad",
            "title: x\nother: *missing",
            "title: x\n...\nmore: y",
            "title: x\n--- \nmore: y",
            "--- x\n--- y",
            "title: x\u{0}",
            "title: x\u{1}",
            "title: |\n  x\u{1B}",
            "\ttitle: x",
        ] {
            assert_eq!(fm_title(block), None, "{block:?}");
        }
        // Control characters are fine in comments and as escapes.
        assert_eq!(yaml_title("title: ok # \u{1}"), Some("ok".into()));
        assert_eq!(yaml_title("title: \"a\\x01\""), Some("a\u{1}".into()));
        assert_eq!(yaml_title("title: x\u{85}y"), Some("x\u{85}y".into()));
        // One explicit document is one document.
        assert_eq!(yaml_title("--- \ntitle: doc"), Some("doc".into()));
        assert_eq!(yaml_title("title: end\n..."), Some("end".into()));
        // `--- ` with a trailing space does not close the frontmatter.
        assert_eq!(yaml_title("%YAML 1.2\n--- \ntitle: v"), Some("v".into()));
    }

    #[test]
    fn duplicate_keys_discard_the_whole_block() {
        for block in [
            "title: a\ntitle: b",
            "title: a\nother: 1\nother: 2",
            "title: a\nnested:\n  k: 1\n  k: 2",
            "title: [{k: 1, k: 2}]",
            "title: {a: 1, a: 2}",
            "1: a\n1.0: b\ntitle: x",
            "~: a\nnull: b\ntitle: x",
            "[a, b]: 1\n\"a,b\": 2\ntitle: x",
            "? [a, [b]]\n: 1\ntitle: x",
            "title: a\n<<: {title: b}\ntitle: c",
        ] {
            assert_eq!(fm_title(block), None, "{block:?}");
        }
        // Different keys that look alike are fine.
        assert_eq!(yaml_title("title: a\nTitle: b"), Some("a".into()));
        assert_eq!(yaml_title("'1': a\n'01': b\ntitle: x"), Some("x".into()));
    }

    #[test]
    fn keys_are_stringified() {
        assert_eq!(
            yaml_title("? [title]\n: array key"),
            Some("array key".into())
        );
        assert_eq!(
            yaml_title("\"title\": quoted key"),
            Some("quoted key".into())
        );
        assert_eq!(yaml_title("? title\n: explicit"), Some("explicit".into()));
        assert_eq!(
            yaml_title("? |-\n  title\n: block key"),
            Some("block key".into())
        );
        assert_eq!(yaml_title("{title: a}: 1"), None);
    }

    #[test]
    fn aliases_and_anchors() {
        assert_eq!(
            yaml_title("name: &n Anchored\ntitle: *n"),
            Some("Anchored".into())
        );
        assert_eq!(yaml_title("list: &l [a, b]\ntitle: *l"), Some("a,b".into()));
        assert_eq!(
            yaml_title("list: &l [a, b]\ntitle: [*l, *l]"),
            Some("a,b,a,b".into())
        );
        assert_eq!(yaml_title("n: &n 012\ntitle: *n"), Some("12".into()));
        assert_eq!(
            yaml_title("k: &t title\n*t : aliased key"),
            Some("aliased key".into())
        );
        // Redefined anchors: later aliases see the later node.
        assert_eq!(
            yaml_title("a: &x one\nb: &x two\ntitle: *x"),
            Some("two".into())
        );
        // A sequence that contains itself: V8's join prints the inner reference as "".
        assert_eq!(yaml_title("title: &a [x, *a]"), Some("x,".into()));
        assert_eq!(yaml_title("title: &a [*a]"), None);
        assert_eq!(yaml_title("title: &a [x, [y, *a]]"), Some("x,y,".into()));
        // A mapping that contains itself is just an object.
        assert_eq!(
            yaml_title("title: &m {self: *m}"),
            Some("[object Object]".into())
        );
        // !!pairs re-points its anchor at the constructed array.
        assert_eq!(
            yaml_title("p: &p !!pairs [a: 1]\ntitle: *p"),
            Some("a,1".into())
        );
    }

    #[test]
    fn merge_keys() {
        let base = "base: &b\n  title: From base\n  other: 1\n";
        assert_eq!(
            yaml_title(&format!("{base}<<: *b")),
            Some("From base".into())
        );
        // Explicit keys win over merged ones, before or after the merge.
        assert_eq!(
            yaml_title(&format!("{base}<<: *b\ntitle: Own")),
            Some("Own".into())
        );
        assert_eq!(
            yaml_title(&format!("{base}title: Own\n<<: *b")),
            Some("Own".into())
        );
        // Each merged key may be overridden once; a second explicit one is a duplicate.
        assert_eq!(
            yaml_title(&format!("{base}<<: *b\ntitle: A\nother: 2")),
            Some("A".into())
        );
        assert_eq!(fm_title(&format!("{base}<<: *b\ntitle: A\ntitle: B")), None);
        // A list of sources: earlier ones win.
        assert_eq!(
            yaml_title("a: &a {title: A}\nb: &b {title: B}\n<<: [*a, *b]"),
            Some("A".into())
        );
        assert_eq!(yaml_title("<<: {title: inline}"), Some("inline".into()));
        assert_eq!(yaml_title("<<: [{title: x}, {title: y}]"), Some("x".into()));
        // Arrays merge their indices; dates merge nothing.
        assert_eq!(yaml_title("<<: [[a]]\ntitle: t"), Some("t".into()));
        assert_eq!(yaml_title("<<: [2024-01-01]\ntitle: t"), Some("t".into()));
        // Quoted `<<` is an ordinary key.
        assert_eq!(yaml_title("'<<': {title: no}"), None);
        assert_eq!(
            yaml_title("a: 1\n!!merge <<: {title: tagged}"),
            Some("tagged".into())
        );
        // Merge sources must be objects.
        for block in [
            "<<: x\ntitle: t",
            "<<: [x]\ntitle: t",
            "<<: ~\ntitle: t",
            "<<:\ntitle: t",
        ] {
            assert_eq!(fm_title(block), None, "{block:?}");
        }
        // Nested mappings merge too: a merged `toString` is an own key.
        assert_eq!(
            yaml_title("d: &d {x: 1}\ntitle: {<<: *d}"),
            Some("[object Object]".into())
        );
        let (fm, _) = split_raw("---\nd: &d {toString: 1}\ntitle: [{<<: *d}]\n---\n");
        assert!(fm.title_string().is_err());
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let mut block = String::from("a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for pair in names.windows(2) {
            let refs = vec![format!("*{}", pair[0]); 9].join(", ");
            block.push_str(&format!("{}: &{} [{refs}]\n", pair[1], pair[1]));
        }
        // Without a title the bomb is never expanded.
        assert_eq!(fm_title(&block), None);
        let with_title = format!("{block}title: *i\n");
        let started = std::time::Instant::now();
        assert_eq!(fm_title(&with_title), None);
        // As keys and merges.
        let keyed = format!("{block}? *b\n: x\ntitle: t\n");
        assert_eq!(yaml_title(&keyed), None);
        let long = "x".repeat(100_000);
        let refs = vec!["*s"; 50_000].join(", ");
        let key_bomb = format!("s: &s {long}\n? [{refs}]\n: v\ntitle: t\n");
        assert_eq!(yaml_title(&key_bomb), None);
        let merged = format!("{block}<<: *i\ntitle: t\n");
        assert_eq!(yaml_title(&merged), Some("t".into()));
        assert!(started.elapsed().as_secs() < 10);
    }

    #[test]
    fn nesting_is_bounded() {
        // Compact block sequences nest one level per `- ` (the root mapping is one more).
        let ok = format!("title:\n{}x", "- ".repeat(MAX_NESTING - 1));
        assert_eq!(yaml_title(&ok), Some("x".into()));
        let deep = format!("title:\n{}x", "- ".repeat(MAX_NESTING));
        assert_eq!(fm_title(&deep), None);
        // saphyr stops at 255 nested flow collections.
        let flow = |n: usize| format!("title: {}x{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(yaml_title(&flow(255)), Some("x".into()));
        assert_eq!(fm_title(&flow(256)), None);
        // Aliases can build deeper values than the text: String() then throws.
        let mut chain = String::from("l0: &l0 [x]\n");
        for i in 1..=MAX_STRING_DEPTH + 1 {
            chain.push_str(&format!("l{i}: &l{i} [*l{}]\n", i - 1));
        }
        chain.push_str(&format!("title: *l{}\n", MAX_STRING_DEPTH + 1));
        let (fm, _) = split_raw(&format!("---\n{chain}---\n"));
        assert!(fm.title_string().is_err());
    }

    /// Places where js-yaml reads the syntax differently from the YAML spec (and from
    /// saphyr); every expectation was checked against js-yaml 4.1.1.
    #[test]
    fn js_yaml_syntax_quirks() {
        let cases: &[(&str, Option<&str>)] = &[
            // Properties on the first key of a block mapping: js-yaml refuses them.
            ("&t title: key", None),
            ("!!str title: key", None),
            ("&x [title]: key", None),
            ("a: 1\n&t title: key", Some("key")),
            ("a: 1\n!!str title: key", Some("key")),
            ("? &t title\n: explicit", Some("explicit")),
            ("a:\n  &t b: 1\ntitle: t", None),
            ("a: &t\n  b: 1\ntitle: t", Some("t")),
            ("title: {&k a: 1}", Some("[object Object]")),
            // No tab may precede a block key or `-` on its line.
            ("\ttitle: x", None),
            ("a:\n \tb: 1\ntitle: t", None),
            ("a:\n  \t- x\ntitle: t", None),
            (" \t? title\n  : x", None),
            ("title: [\tx]", Some("x")),
            ("title:\t x", Some("x")),
            ("title: x\t", Some("x")),
            // A tab right after `:` is separation for js-yaml (saphyr refuses it).
            ("title:\tx", Some("x")),
            ("a:\t1\ntitle:\t\tT", Some("T")),
            ("a: 'b:\tc'\ntitle:\tT", Some("T")),
            // Quoted continuation lines may sit at any indentation, tabs included.
            ("title: \"A long\ntitle\"", Some("A long title")),
            ("title: 'A long\n\n title'", Some("A long\ntitle")),
            ("title: \"a\n\tb\"", Some("a b")),
            ("  title: \"x\n\n\t y\"", Some("x\ny")),
            // So may flow collection lines, except that a plain scalar continued on a
            // line indented no deeper than the block ends there (then a comma is missing).
            ("tags: [a, b,\nc]\ntitle: T", Some("T")),
            ("title: [a,\nb]", Some("a,b")),
            ("title: {k: v,\nk2: v2}", Some("[object Object]")),
            ("title: [x\n y]", Some("x y")),
            ("title: [x\ny]", None),
            ("  title: [x\ny]", None),
            ("  title: [x\n   y]", Some("x y")),
            ("a:\n  title: [x\n  y]", None),
            ("title: [x\n\n 1]", Some("x\n1")),
            ("title: [x\n  \n1]", None),
            ("  title: [a,\rb\rc]", None),
            ("  title: [a,\r\nb\r\n   c]", Some("a,b c")),
            // Characters a plain scalar may not start with.
            ("title: [|]", None),
            ("title: [>]", None),
            ("title: [-]", None),
            ("title: [-x]", Some("-x")),
            ("title: {-: 1}", Some("[object Object]")),
            ("title: :x", Some(":x")),
            // `:` at the start of a line wants `?` for its empty key.
            ("title: x\n: y", None),
            ("? \n: x\ntitle: t", Some("t")),
            // js-yaml's JSON rule in quoted scalars lets DEL, C1 controls and U+FFFE pass.
            ("title: \"x\u{7F}\"", Some("x\u{7F}")),
            ("title: 'x\u{FFFE}'", Some("x\u{FFFE}")),
            ("title: x\u{7F}", None),
            ("title: |\n  x\u{9F}", None),
            ("&a\u{7F} title: x", None),
            ("a: 1\n&a\u{7F} title: x", Some("x")),
            // Surrogate pairs written as two escapes are joined; a lone one is refused.
            ("title: \"\\ud83d\\ude00\"", Some("\u{1F600}")),
            (
                "title: \"a\\uD83D\\uDE00b\\u00e9\"",
                Some("a\u{1F600}b\u{e9}"),
            ),
            ("title: \"\\ud800\"", None),
            ("title: '\\ud83d\\ude00'", Some("\\ud83d\\ude00")),
        ];
        for (block, want) in cases {
            assert_eq!(yaml_title(block).as_deref(), *want, "{block:?}");
        }
    }

    #[test]
    fn repairs_touch_only_whitespace() {
        assert_eq!(
            repair("a:\tb", 3, Repair::TabAfterColon),
            Some(("a: b".to_owned(), None))
        );
        assert_eq!(repair("a: b", 3, Repair::TabAfterColon), None);
        assert_eq!(
            repair("t: 'a\nb'\nc: d", 3, Repair::QuotedIndent),
            Some(("t: 'a\n   b'\nc: d".to_owned(), None))
        );
        assert_eq!(repair("t: 'a\n--- b'", 3, Repair::QuotedIndent), None);
        assert_eq!(repair("t: 'a\nb", 3, Repair::QuotedIndent), None);
        assert_eq!(
            repair("- a: [x,\ny]", 9, Repair::FlowIndent),
            Some(("- a: [x,\n   y]".to_owned(), Some((1, 3))))
        );
        assert_eq!(
            repair("t: \"a\n \tb\"", 7, Repair::QuotedTab),
            Some(("t: \"a\n  b\"".to_owned(), None))
        );
        assert_eq!(
            repair(r#"t: "\ud83d\ude00\\ud83d""#, 3, Repair::SurrogatePair),
            Some((r#"t: "\U0001F600\\ud83d""#.to_owned(), None))
        );
        assert_eq!(repair(r#"t: "\ud800""#, 3, Repair::SurrogatePair), None);
        assert_eq!(block_prefix_width("  - ? a: b"), 6);
        assert_eq!(
            lines("a\r\nb\rc\nd").collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(line_index("a\r\nb\rc\nd", 7), 3);
        assert_eq!(line_index("a\rb", 2), 1);
        assert_eq!(line_index("a\r\nb", 2), 0);
        assert_eq!(line_index("a\r\nb", 3), 1);
    }

    #[test]
    fn radix_parsing_rounds_like_v8() {
        assert_eq!(pow2_radix_value(b"", 4), 0.0);
        assert_eq!(pow2_radix_value(b"0000", 4), 0.0);
        assert_eq!(pow2_radix_value(b"ff", 4), 255.0);
        assert_eq!(pow2_radix_value(b"17", 3), 15.0);
        assert_eq!(pow2_radix_value(b"101", 1), 5.0);
        // 2^53 + 1 ties to even (down), 2^53 + 3 ties up.
        assert_eq!(
            pow2_radix_value(b"20000000000001", 4),
            9_007_199_254_740_992.0
        );
        assert_eq!(
            pow2_radix_value(b"20000000000003", 4),
            9_007_199_254_740_996.0
        );
        // Values printed by node's parseInt(h, 16), as BigInt.
        assert_eq!(
            pow2_radix_value(b"fffffffffffff800", 4),
            18_446_744_073_709_549_568.0
        );
        assert_eq!(
            pow2_radix_value(b"fffffffffffffc00", 4),
            18_446_744_073_709_551_616.0
        );
        assert_eq!(
            pow2_radix_value(b"fffffffffffff400", 4),
            18_446_744_073_709_547_520.0
        );
        assert_eq!(
            pow2_radix_value(b"fffffffffffffbff", 4),
            18_446_744_073_709_549_568.0
        );
        let huge = vec![b'f'; 300];
        assert_eq!(pow2_radix_value(&huge, 4), f64::INFINITY);
    }
}
