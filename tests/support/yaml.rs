//! A small YAML reader for the documents the tests hold the code to (`docs/openapi.yaml`,
//! `deploy/prometheus/alerts.yml`), built on saphyr-parser's events: one document of
//! block or flow mappings and sequences, anchors and aliases, quoted and block scalars as
//! strings, plain scalars resolved by YAML 1.2's core schema (null, booleans, integers,
//! floats, else strings). Tags, merge keys, complex keys and duplicate keys are refused
//! rather than guessed at.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, StrInput};
use serde_json::{Map, Number, Value};

/// Parses one YAML document into JSON values.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut loader = Loader {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
    };
    match loader.next()? {
        Event::StreamStart => {}
        e => return Err(format!("expected the stream start, got {e:?}")),
    }
    match loader.next()? {
        Event::DocumentStart(_) => {}
        e => return Err(format!("expected one document, got {e:?}")),
    }
    let first = loader.next()?;
    let value = loader.node(first)?;
    match loader.next()? {
        Event::DocumentEnd => {}
        e => return Err(format!("expected the document end, got {e:?}")),
    }
    match loader.next()? {
        Event::StreamEnd => Ok(value),
        e => Err(format!("expected a single document, got {e:?}")),
    }
}

struct Loader<'a> {
    parser: Parser<'a, StrInput<'a>>,
    anchors: HashMap<usize, Value>,
}

impl<'a> Loader<'a> {
    fn next(&mut self) -> Result<Event<'a>, String> {
        match self.parser.next_event() {
            Some(Ok((event, _))) => Ok(event),
            Some(Err(e)) => Err(format!("YAML: {e}")),
            None => Err("YAML: unexpected end".to_owned()),
        }
    }

    fn remember(&mut self, anchor: usize, value: &Value) {
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
    }

    fn node(&mut self, event: Event<'a>) -> Result<Value, String> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                if tag.is_some() {
                    return Err(format!("YAML: tags are not supported (at {text:?})"));
                }
                let value = if style == ScalarStyle::Plain {
                    plain(&text)
                } else {
                    Value::String(text.into_owned())
                };
                self.remember(anchor, &value);
                Ok(value)
            }
            Event::SequenceStart(anchor, tag) => {
                if tag.is_some() {
                    return Err("YAML: tags are not supported".to_owned());
                }
                let mut items = Vec::new();
                loop {
                    match self.next()? {
                        Event::SequenceEnd => break,
                        e => items.push(self.node(e)?),
                    }
                }
                let value = Value::Array(items);
                self.remember(anchor, &value);
                Ok(value)
            }
            Event::MappingStart(anchor, tag) => {
                if tag.is_some() {
                    return Err("YAML: tags are not supported".to_owned());
                }
                let mut map = Map::new();
                loop {
                    let key = match self.next()? {
                        Event::MappingEnd => break,
                        Event::Scalar(k, _, 0, None) => k.into_owned(),
                        e => return Err(format!("YAML: unsupported mapping key {e:?}")),
                    };
                    if key == "<<" {
                        return Err("YAML: merge keys are not supported".to_owned());
                    }
                    let event = self.next()?;
                    let value = self.node(event)?;
                    if map.insert(key.clone(), value).is_some() {
                        return Err(format!("YAML: duplicate key {key:?}"));
                    }
                }
                let value = Value::Object(map);
                self.remember(anchor, &value);
                Ok(value)
            }
            Event::Alias(id) => self
                .anchors
                .get(&id)
                .cloned()
                .ok_or_else(|| "YAML: alias to an unknown anchor".to_owned()),
            e => Err(format!("YAML: unexpected {e:?}")),
        }
    }
}

/// A plain scalar by the core schema.
fn plain(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = s.parse::<i64>() {
            return Value::Number(n.into());
        }
    }
    let numeric = s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        && s.bytes().any(|b| b.is_ascii_digit());
    if numeric {
        if let Some(n) = s.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    Value::String(s.to_owned())
}
