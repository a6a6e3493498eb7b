//! Frontmatter as the gateway sees it: only `title` (and, for the REST scope filter,
//! `project`) is ever read (spec §2, §3, §5).
//!
//! Two things live here: [`FmValue`], a model of the JavaScript value the gateway holds
//! (with an exact `String()`), and [`decode_stored`], the gateway's two decoders of the
//! canister's `frontmatter` field.

use crate::js;
use serde_json::{Map, Value};

/// How deeply nested arrays [`FmValue::js_string`] follows before it gives up and
/// reports that `String()` throws.
///
/// V8's `Array.prototype.join` recurses and overflows its stack (a `RangeError`, so the
/// request fails) somewhere between 1,000 and 5,000 levels; 1,000 is the low end of that.
/// JSON never gets near it: `serde_json` refuses nesting deeper than 128.
pub const MAX_STRING_DEPTH: usize = 1000;

/// A frontmatter value as JavaScript holds it after `JSON.parse` or js-yaml `load`.
#[derive(Debug, Clone, PartialEq)]
pub enum FmValue {
    /// `null` (and YAML `~`, empty).
    Null,
    /// A boolean.
    Bool(bool),
    /// A number (IEEE double).
    Number(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<FmValue>),
    /// A plain object; only whether it has an own `toString` key matters.
    Object {
        /// `String()` throws on such an object.
        has_own_to_string: bool,
    },
    /// A `Date` (a YAML timestamp): milliseconds since the epoch, NaN when invalid.
    Date(f64),
    /// A `Uint8Array` (YAML `!!binary`).
    Bytes(Vec<u8>),
}

/// `String()` threw (an object with its own `toString` key, or arrays nested beyond
/// [`MAX_STRING_DEPTH`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("String() of the value throws")]
pub struct ToStringThrows;

impl FmValue {
    /// Converts a parsed JSON value.
    pub fn from_json(v: &Value) -> FmValue {
        match v {
            Value::Null => FmValue::Null,
            Value::Bool(b) => FmValue::Bool(*b),
            // Every serde_json number has an f64 form; NaN is unreachable.
            Value::Number(n) => FmValue::Number(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => FmValue::String(s.clone()),
            Value::Array(a) => FmValue::Array(a.iter().map(FmValue::from_json).collect()),
            Value::Object(o) => FmValue::Object {
                has_own_to_string: o.contains_key("toString"),
            },
        }
    }

    /// JavaScript `String(value)`.
    ///
    /// Arrays are `Array.prototype.join(",")`: `null` elements give empty strings and
    /// nested arrays are joined the same way. An object with its own `toString` key,
    /// anywhere, makes the whole conversion throw, as it does in JavaScript (the key's
    /// value is data, not a function, so `ToPrimitive` fails). Iterative, so deep
    /// nesting costs no stack.
    pub fn js_string(&self) -> Result<String, ToStringThrows> {
        let mut out = String::new();
        // The arrays being joined, innermost last: the elements left, and whether a
        // separator goes before the next one.
        let mut open: Vec<(std::slice::Iter<'_, FmValue>, bool)> = Vec::new();
        let mut next = self;
        loop {
            match next {
                FmValue::Array(items) => {
                    if open.len() >= MAX_STRING_DEPTH {
                        return Err(ToStringThrows);
                    }
                    open.push((items.iter(), false));
                }
                leaf => leaf.write_leaf(&mut out)?,
            }
            loop {
                let Some((items, separate)) = open.last_mut() else {
                    return Ok(out);
                };
                match items.next() {
                    Some(item) => {
                        if *separate {
                            out.push(',');
                        }
                        *separate = true;
                        // join() turns null and undefined elements into "", unlike String().
                        if *item != FmValue::Null {
                            next = item;
                            break;
                        }
                    }
                    None => {
                        open.pop();
                    }
                }
            }
        }
    }

    /// Appends `String(self)` for anything but an array.
    fn write_leaf(&self, out: &mut String) -> Result<(), ToStringThrows> {
        match self {
            FmValue::Null => out.push_str("null"),
            FmValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            FmValue::Number(n) => out.push_str(&js::number_to_string(*n)),
            FmValue::String(s) => out.push_str(s),
            FmValue::Object {
                has_own_to_string: true,
            } => return Err(ToStringThrows),
            FmValue::Object { .. } => out.push_str("[object Object]"),
            // Arrays are joined by js_string itself.
            FmValue::Array(_) => {}
            FmValue::Date(t) => out.push_str(&date_to_string(*t)),
            FmValue::Bytes(bytes) => {
                // Uint8Array's toString is Array.prototype.join.
                for (i, b) in bytes.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&b.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The only frontmatter fields the sidecar ever reads.
///
/// This is an allowlist: nothing else from a note's frontmatter is ever stored, so
/// nothing else can leak into a response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frontmatter {
    /// The `title` value, if the key is present.
    pub title: Option<FmValue>,
    /// The `project` value, if present (REST scope filter only).
    pub project: Option<FmValue>,
}

impl Frontmatter {
    /// Keeps the allowlisted fields of a decoded frontmatter object.
    fn from_object(o: &Map<String, Value>) -> Frontmatter {
        Frontmatter {
            title: o.get("title").map(FmValue::from_json),
            project: o.get("project").map(FmValue::from_json),
        }
    }

    /// The title taken from frontmatter (spec §5, first paragraph): present, not null,
    /// and its `String()` form non-empty after JS-trimming. `None` means the caller falls
    /// back to the path; an error means `String()` threw and the whole request fails.
    pub fn title_string(&self) -> Result<Option<String>, ToStringThrows> {
        match &self.title {
            None | Some(FmValue::Null) => Ok(None),
            Some(v) => {
                let s = v.js_string()?;
                let t = js::trim(&s);
                Ok((!t.is_empty()).then(|| t.to_owned()))
            }
        }
    }
}

/// Which surface's decoder to apply (spec §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The REST route's decoder.
    Rest,
    /// The hosted MCP tool's decoder.
    Mcp,
}

/// The MCP decoder's unguarded `JSON.parse` threw (spec §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("frontmatter could not be decoded")]
pub struct FrontmatterError;

/// Decodes the canister's `frontmatter` field (`None` when absent) as `surface` does.
///
/// Parse errors give empty frontmatter, except in the MCP decoder's last, unguarded
/// parse, which fails the request (`Err`). `serde_json` refuses a few texts that
/// `JSON.parse` accepts (a lone surrogate escape, nesting deeper than 128, numbers
/// beyond the f64 range); they count as parse errors.
pub fn decode_stored(
    value: Option<&Value>,
    surface: Surface,
) -> Result<Frontmatter, FrontmatterError> {
    let object = match value {
        Some(Value::Object(o)) => return Ok(Frontmatter::from_object(o)),
        Some(Value::String(s)) => match surface {
            Surface::Rest => decode_rest(s),
            Surface::Mcp => decode_mcp(s)?,
        },
        // null, absent, numbers, booleans and arrays all mean "no frontmatter".
        _ => None,
    };
    Ok(object
        .map(|o| Frontmatter::from_object(&o))
        .unwrap_or_default())
}

/// How many times the REST decoder unwraps a JSON string before giving up.
const REST_ROUNDS: usize = 8;

/// The REST decoder for a string field: `None` means `{}`.
fn decode_rest(s: &str) -> Option<Map<String, Value>> {
    let s = s.strip_prefix('\u{FEFF}').unwrap_or(s);
    let mut text = js::trim(s).to_owned();
    if text.is_empty() {
        return None;
    }
    for _ in 0..REST_ROUNDS {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(o)) => return Some(o),
            Ok(Value::String(inner)) => {
                let next = js::trim(&inner);
                if next == text {
                    return None;
                }
                text = next.to_owned();
            }
            _ => return None,
        }
    }
    None
}

/// The MCP decoder for a string field: `Ok(None)` means `{}`.
fn decode_mcp(s: &str) -> Result<Option<Map<String, Value>>, FrontmatterError> {
    let s = js::trim(s);
    if s.is_empty() || s == "{}" {
        return Ok(None);
    }
    if let Some(o) = mcp_try(s) {
        return Ok(Some(o));
    }
    if s.contains("\\\"") {
        if let Some(o) = mcp_try(&s.replace("\\\"", "\"")) {
            return Ok(Some(o));
        }
    }
    if s.starts_with('"') && s.ends_with('"') {
        // The gateway does not catch this parse: a malformed quoted string fails the call.
        let parsed: Value = serde_json::from_str(s).map_err(|_| FrontmatterError)?;
        // A text that starts with a quote can only parse to a string.
        if let Value::String(inner) = parsed {
            return Ok(mcp_try(&inner));
        }
    }
    Ok(None)
}

/// The MCP decoder's `try`: parse, unwrapping JSON strings (JS-trimmed) until something
/// else comes out. It terminates because each unwrapped string is shorter than the
/// literal it came from.
fn mcp_try(text: &str) -> Option<Map<String, Value>> {
    let mut parsed = serde_json::from_str::<Value>(text).ok()?;
    loop {
        match parsed {
            Value::Object(o) => return Some(o),
            Value::String(inner) => parsed = serde_json::from_str(js::trim(&inner)).ok()?,
            _ => return None,
        }
    }
}

/// Milliseconds in a day.
const MS_PER_DAY: i64 = 86_400_000;

/// The largest time value a `Date` holds (ECMAScript TimeClip).
const MAX_TIME: f64 = 8.64e15;

/// ECMAScript `Date.UTC(year, month, day, hours, minutes, seconds, ms)` for integral
/// arguments: years 0–99 mean 1900–1999, out-of-range fields carry over, and a result
/// outside the `Date` range is NaN.
pub(crate) fn date_utc(
    year: i64,
    month: i64,
    day: i64,
    hours: i64,
    minutes: i64,
    seconds: i64,
    ms: i64,
) -> f64 {
    let year = if (0..=99).contains(&year) {
        1900 + year
    } else {
        year
    };
    // MakeDay: months carry into years, days past the month's end carry on.
    let days = days_from_civil(year + month.div_euclid(12), month.rem_euclid(12) + 1, 1) + day - 1;
    let time = hours * 3_600_000 + minutes * 60_000 + seconds * 1000 + ms;
    time_clip((days * MS_PER_DAY + time) as f64)
}

/// ECMAScript TimeClip for an integral time value.
pub(crate) fn time_clip(t: f64) -> f64 {
    if t.is_finite() && t.abs() <= MAX_TIME {
        t
    } else {
        f64::NAN
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (month 1–12).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Count years from March so the leap day is the last day of the year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian (year, month 1–12, day) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `Date.prototype.toString()` as V8 prints it with the host time zone set to UTC
/// (spec §5 **Deviation**: the sidecar always prints UTC).
fn date_to_string(t: f64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = time_clip(t.trunc());
    if t.is_nan() {
        return "Invalid Date".to_owned();
    }
    // |t| <= 8.64e15, so the conversion is exact.
    let t = t as i64;
    let days = t.div_euclid(MS_PER_DAY);
    let in_day = t.rem_euclid(MS_PER_DAY) / 1000;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday; month is 1–12 by construction.
    let weekday = DAYS[(days + 4).rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    // V8 pads the year to four digits and puts the sign in front.
    let year = if year < 0 {
        format!("-{:04}", -year)
    } else {
        format!("{year:04}")
    };
    format!(
        "{weekday} {month_name} {day:02} {year} {:02}:{:02}:{:02} GMT+0000 (Coordinated Universal Time)",
        in_day / 3600,
        in_day / 60 % 60,
        in_day % 60
    )
}

#[cfg(test)]
// A failed expectation in a test should panic with its message.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(v: Value) -> Result<String, ToStringThrows> {
        FmValue::from_json(&v).js_string()
    }

    fn title(fm: &Frontmatter) -> Option<FmValue> {
        fm.title.clone()
    }

    fn both(v: Value) -> (Option<FmValue>, Option<FmValue>) {
        let rest = decode_stored(Some(&v), Surface::Rest).expect("REST never fails");
        let mcp = decode_stored(Some(&v), Surface::Mcp).expect("MCP decodes");
        (title(&rest), title(&mcp))
    }

    fn text(t: &str) -> Option<FmValue> {
        Some(FmValue::String(t.to_owned()))
    }

    #[test]
    fn string_of_numbers_is_ecmascript() {
        let cases: &[(&str, &str)] = &[
            ("42", "42"),
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("12345678901234567890", "12345678901234567000"),
            ("1e-7", "1e-7"),
            ("0.1", "0.1"),
        ];
        for (json_text, want) in cases {
            let v: Value = serde_json::from_str(json_text).expect("valid JSON");
            assert_eq!(s(v).as_deref(), Ok(*want), "String({json_text})");
        }
        assert_eq!(FmValue::Number(-0.0).js_string().as_deref(), Ok("0"));
    }

    #[test]
    fn string_of_scalars_arrays_and_objects() {
        assert_eq!(s(json!(true)).as_deref(), Ok("true"));
        assert_eq!(s(json!(false)).as_deref(), Ok("false"));
        assert_eq!(s(json!(null)).as_deref(), Ok("null"));
        assert_eq!(s(json!("x")).as_deref(), Ok("x"));
        assert_eq!(s(json!(["a", "b"])).as_deref(), Ok("a,b"));
        assert_eq!(s(json!([])).as_deref(), Ok(""));
        assert_eq!(s(json!([null])).as_deref(), Ok(""));
        assert_eq!(
            s(json!(["a", ["b", null, ["c"]], null, 1])).as_deref(),
            Ok("a,b,,c,,1")
        );
        assert_eq!(s(json!([[null, null]])).as_deref(), Ok(","));
        assert_eq!(s(json!({"a": 1})).as_deref(), Ok("[object Object]"));
        assert_eq!(
            s(json!(["a", {"b": 1}])).as_deref(),
            Ok("a,[object Object]")
        );
        assert_eq!(s(json!([true, 1.5, "x"])).as_deref(), Ok("true,1.5,x"));
    }

    #[test]
    fn own_to_string_throws_anywhere() {
        assert_eq!(s(json!({"toString": "x"})), Err(ToStringThrows));
        assert_eq!(s(json!({"toString": null})), Err(ToStringThrows));
        assert_eq!(s(json!(["a", {"toString": 1}])), Err(ToStringThrows));
        assert_eq!(s(json!([["a", [{"toString": 1}]]])), Err(ToStringThrows));
        // Only an own key counts; valueOf alone is harmless (toString is tried first).
        assert_eq!(s(json!({"valueOf": 1})).as_deref(), Ok("[object Object]"));
        assert_eq!(s(json!({"tostring": 1})).as_deref(), Ok("[object Object]"));
    }

    #[test]
    fn string_of_dates_and_bytes() {
        let jan1 = date_utc(2024, 0, 1, 0, 0, 0, 0);
        assert_eq!(jan1, 1_704_067_200_000.0);
        assert_eq!(
            FmValue::Date(jan1).js_string().as_deref(),
            Ok("Mon Jan 01 2024 00:00:00 GMT+0000 (Coordinated Universal Time)")
        );
        assert_eq!(
            FmValue::Date(f64::NAN).js_string().as_deref(),
            Ok("Invalid Date")
        );
        assert_eq!(
            FmValue::Date(1e16).js_string().as_deref(),
            Ok("Invalid Date")
        );
        assert_eq!(
            FmValue::Date(0.0).js_string().as_deref(),
            Ok("Thu Jan 01 1970 00:00:00 GMT+0000 (Coordinated Universal Time)")
        );
        assert_eq!(
            FmValue::Date(-1.0).js_string().as_deref(),
            Ok("Wed Dec 31 1969 23:59:59 GMT+0000 (Coordinated Universal Time)")
        );
        // Values printed by V8 (node, TZ=UTC).
        assert_eq!(
            FmValue::Date(-62_198_755_200_000.0).js_string().as_deref(),
            Ok("Fri Jan 01 -0001 00:00:00 GMT+0000 (Coordinated Universal Time)")
        );
        assert_eq!(
            FmValue::Date(8.64e15).js_string().as_deref(),
            Ok("Sat Sep 13 275760 00:00:00 GMT+0000 (Coordinated Universal Time)")
        );
        assert_eq!(
            FmValue::Bytes(vec![104, 105]).js_string().as_deref(),
            Ok("104,105")
        );
        assert_eq!(FmValue::Bytes(vec![]).js_string().as_deref(), Ok(""));
        let arr = FmValue::Array(vec![FmValue::Bytes(vec![1, 2]), FmValue::Date(f64::NAN)]);
        assert_eq!(arr.js_string().as_deref(), Ok("1,2,Invalid Date"));
    }

    #[test]
    fn date_utc_follows_ecmascript() {
        // Two-digit years are 1900s; fields carry over.
        assert_eq!(
            date_utc(50, 0, 1, 0, 0, 0, 0),
            date_utc(1950, 0, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            date_utc(2024, 1, 30, 0, 0, 0, 0),
            date_utc(2024, 2, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            date_utc(2024, 12, 1, 0, 0, 0, 0),
            date_utc(2025, 0, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            date_utc(2024, -1, 1, 0, 0, 0, 0),
            date_utc(2023, 11, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            date_utc(2024, 0, 1, 25, 0, 0, 0),
            date_utc(2024, 0, 2, 1, 0, 0, 0)
        );
        assert_eq!(date_utc(2000, 1, 29, 0, 0, 0, 0), 951_782_400_000.0);
        assert!(date_utc(300_000, 0, 1, 0, 0, 0, 0).is_nan());
        for days in [-800_000_i64, -1, 0, 59, 60, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn deep_arrays_throw_past_the_cap() {
        let mut v = FmValue::String("x".into());
        for _ in 0..MAX_STRING_DEPTH {
            v = FmValue::Array(vec![v]);
        }
        assert_eq!(v.js_string().as_deref(), Ok("x"));
        let v = FmValue::Array(vec![v]);
        assert_eq!(v.js_string(), Err(ToStringThrows));
    }

    #[test]
    fn title_string_rules() {
        let fm = |t: Option<FmValue>| Frontmatter {
            title: t,
            project: None,
        };
        assert_eq!(fm(None).title_string(), Ok(None));
        assert_eq!(fm(Some(FmValue::Null)).title_string(), Ok(None));
        assert_eq!(fm(text(" \u{00A0}\u{FEFF} ")).title_string(), Ok(None));
        assert_eq!(
            fm(text("\u{2003} Hello \n")).title_string(),
            Ok(Some("Hello".into()))
        );
        // U+0085 and U+200B are not JavaScript whitespace.
        assert_eq!(
            fm(text("\u{0085}")).title_string(),
            Ok(Some("\u{0085}".into()))
        );
        assert_eq!(
            fm(Some(FmValue::Number(0.0))).title_string(),
            Ok(Some("0".into()))
        );
        assert_eq!(
            fm(Some(FmValue::Bool(false))).title_string(),
            Ok(Some("false".into()))
        );
        assert_eq!(fm(Some(FmValue::Array(vec![]))).title_string(), Ok(None));
        assert_eq!(
            fm(Some(FmValue::Array(vec![FmValue::Null, FmValue::Null]))).title_string(),
            Ok(Some(",".into()))
        );
        assert_eq!(
            fm(Some(FmValue::Object {
                has_own_to_string: true
            }))
            .title_string(),
            Err(ToStringThrows)
        );
    }

    #[test]
    fn absent_null_and_non_string_fields() {
        for surface in [Surface::Rest, Surface::Mcp] {
            assert_eq!(decode_stored(None, surface), Ok(Frontmatter::default()));
            for v in [
                json!(null),
                json!(1),
                json!(true),
                json!(["a"]),
                json!([{"title": "x"}]),
            ] {
                assert_eq!(
                    decode_stored(Some(&v), surface),
                    Ok(Frontmatter::default()),
                    "{v}"
                );
            }
        }
    }

    #[test]
    fn plain_object_is_used_as_is_and_only_allowlisted_keys_are_kept() {
        let v = json!({"title": "T", "project": "p", "api_key": "secret"});
        for surface in [Surface::Rest, Surface::Mcp] {
            let fm = decode_stored(Some(&v), surface).expect("decodes");
            assert_eq!(fm.title, text("T"));
            assert_eq!(fm.project, text("p"));
            assert!(!format!("{fm:?}").contains("secret"));
        }
    }

    #[test]
    fn json_string_of_an_object() {
        let v = json!(r#"{"title":"Hosted Section","api_key":"must-not-leak"}"#);
        assert_eq!(both(v), (text("Hosted Section"), text("Hosted Section")));
        let v = json!(" \u{00A0}{\"title\": 42} \n");
        let n = Some(FmValue::Number(42.0));
        assert_eq!(both(v), (n.clone(), n));
    }

    #[test]
    fn double_encoded_strings() {
        let once = r#"{"title":"Deep"}"#;
        let twice = serde_json::to_string(once).expect("encodes");
        let thrice = serde_json::to_string(&twice).expect("encodes");
        assert_eq!(both(json!(twice)), (text("Deep"), text("Deep")));
        assert_eq!(both(json!(thrice)), (text("Deep"), text("Deep")));
        // Inner strings are JS-trimmed before the next round.
        let padded = serde_json::to_string(" \u{3000}{\"title\":\"P\"} ").expect("encodes");
        assert_eq!(both(json!(padded)), (text("P"), text("P")));
    }

    #[test]
    fn rest_gives_up_after_eight_rounds() {
        let mut t = r#"{"title":"X"}"#.to_owned();
        // Seven encodings: the eighth round parses the object.
        for _ in 0..7 {
            t = serde_json::to_string(&t).expect("encodes");
        }
        let v = json!(t.clone());
        assert_eq!(both(v), (text("X"), text("X")));
        // Eight encodings: REST runs out of rounds, MCP keeps going.
        t = serde_json::to_string(&t).expect("encodes");
        assert_eq!(both(json!(t)), (None, text("X")));
    }

    #[test]
    fn rest_strips_one_bom_and_stops_on_a_fixed_point() {
        let fm = decode_stored(Some(&json!("\u{FEFF}{\"title\":\"B\"}")), Surface::Rest);
        assert_eq!(fm.map(|f| f.title), Ok(text("B")));
        // A JSON string whose trimmed content equals the text just parsed cannot occur
        // for well-formed JSON, but a string that is not an object ends the loop.
        assert_eq!(both(json!("\"plain\"")), (None, None));
        assert_eq!(both(json!("\"\"")), (None, None));
    }

    #[test]
    fn backslash_escaped_quotes() {
        let v = json!(r#"{\"title\":\"Esc\"}"#);
        assert_eq!(both(v), (None, text("Esc")));
        // Wrapped in quotes too: MCP still gets there through the replacement.
        let v = json!(r#""{\"title\":\"Wrapped\"}""#);
        assert_eq!(both(v), (text("Wrapped"), text("Wrapped")));
    }

    #[test]
    fn empty_braces_and_whitespace() {
        for t in ["", "   ", "\u{FEFF}", "\u{00A0}\n", "{}", " {} "] {
            assert_eq!(both(json!(t)), (None, None), "{t:?}");
        }
        assert_eq!(
            both(json!(r#"{"title":null}"#)),
            (Some(FmValue::Null), Some(FmValue::Null))
        );
    }

    #[test]
    fn arrays_numbers_and_garbage_as_frontmatter_text() {
        for t in [
            "[1,2]",
            r#"[{"title":"x"}]"#,
            "42",
            "true",
            "null",
            "title: x",
            "{",
            "{'a':1}",
        ] {
            assert_eq!(both(json!(t)), (None, None), "{t:?}");
        }
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let v = json!(r#"{"title":"first","title":"second"}"#);
        assert_eq!(both(v), (text("second"), text("second")));
    }

    #[test]
    fn lone_surrogate_is_a_parse_error() {
        let v = json!(r#"{"title":"\ud800"}"#);
        assert_eq!(both(v), (None, None));
        let v = json!(r#""\ud800""#);
        assert_eq!(decode_stored(Some(&v), Surface::Mcp), Err(FrontmatterError));
    }

    #[test]
    fn mcp_malformed_quoted_string_fails_the_request() {
        let v = json!(r#""a"b""#);
        assert_eq!(
            decode_stored(Some(&v), Surface::Rest),
            Ok(Frontmatter::default())
        );
        assert_eq!(decode_stored(Some(&v), Surface::Mcp), Err(FrontmatterError));
        let v = json!("\"");
        assert_eq!(decode_stored(Some(&v), Surface::Mcp), Err(FrontmatterError));
        // Well-formed quoted strings that hold no object are simply empty.
        let v = json!(r#""just text""#);
        assert_eq!(
            decode_stored(Some(&v), Surface::Mcp),
            Ok(Frontmatter::default())
        );
        // Not quoted at both ends: no unguarded parse.
        let v = json!(r#""a"b"#);
        assert_eq!(
            decode_stored(Some(&v), Surface::Mcp),
            Ok(Frontmatter::default())
        );
    }

    #[test]
    fn project_is_kept_for_the_scope_filter() {
        let v = json!(r#"{"project":["a",1]}"#);
        let fm = decode_stored(Some(&v), Surface::Rest).expect("decodes");
        assert_eq!(
            fm.project,
            Some(FmValue::Array(vec![
                FmValue::String("a".into()),
                FmValue::Number(1.0)
            ]))
        );
        assert_eq!(fm.title, None);
    }

    #[test]
    fn titles_of_decoded_notes() {
        let cases: &[(&str, Result<Option<&str>, ToStringThrows>)] = &[
            (r#"{"title":42}"#, Ok(Some("42"))),
            (r#"{"title":1.0}"#, Ok(Some("1"))),
            (r#"{"title":1e21}"#, Ok(Some("1e+21"))),
            (
                r#"{"title":12345678901234567890}"#,
                Ok(Some("12345678901234567000")),
            ),
            (r#"{"title":true}"#, Ok(Some("true"))),
            (r#"{"title":["a","b"]}"#, Ok(Some("a,b"))),
            (r#"{"title":[null]}"#, Ok(None)),
            (r#"{"title":{}}"#, Ok(Some("[object Object]"))),
            (r#"{"title":{"toString":"x"}}"#, Err(ToStringThrows)),
            (r#"{"title":["a",{"toString":"x"}]}"#, Err(ToStringThrows)),
            (r#"{"title":"  "}"#, Ok(None)),
            (r#"{"title":null}"#, Ok(None)),
            (r#"{"other":"x"}"#, Ok(None)),
        ];
        for (t, want) in cases {
            for surface in [Surface::Rest, Surface::Mcp] {
                let fm = decode_stored(Some(&json!(t)), surface).expect("decodes");
                let got = fm.title_string();
                assert_eq!(
                    got.as_ref().map(|o| o.as_deref()),
                    want.as_ref().map(|o| *o),
                    "{t}"
                );
            }
        }
    }
}
