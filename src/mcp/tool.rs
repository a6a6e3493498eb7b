//! The view tools' arguments and results (`get_section_source`, `get_note_outline`,
//! `get_document_tree`: the same input schema), as the SDK words them (wire contract
//! §6).

use serde::Serialize;
use serde_json::{Map, Value};

use super::wire::tool_name;
use crate::extract::View;

/// The SDK's prefix for argument errors, before the tool's name.
const ARGUMENT_PREFIX: &str =
    "MCP error -32602: Input validation error: Invalid arguments for tool ";

/// Why the tool answered `isError: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFailure {
    /// The policy denies the role: the SDK's unknown-tool text.
    Denied,
    /// Arguments refused before the tool runs (plain SDK text).
    Arguments(ArgumentIssue),
    /// A string path that fails §3 (no upstream call).
    InvalidPath,
    /// The canister answered this non-2xx status.
    Upstream(u16),
    /// Anything else: timeout, malformed note, frontmatter, cap, no canister.
    Runtime,
}

/// The first argument problem found, in the SDK's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentIssue {
    /// `arguments` absent, or not an object (**Deviation** for the latter): the type
    /// received.
    NotAnObject(JsType),
    /// `path` missing or not a string: the type received; `extra` when other keys were
    /// present too.
    Path {
        /// What `path` was.
        received: JsType,
        /// Whether other keys were present.
        extra: bool,
    },
    /// `path` is a string but other keys are present (**Deviation**: the SDK strips them).
    ExtraKeys,
}

/// A JSON value's type as zod names it in "received …".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsType {
    /// Absent.
    Undefined,
    /// `null`.
    Null,
    /// A number.
    Number,
    /// `true`/`false`.
    Boolean,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsType {
    fn of(v: Option<&Value>) -> JsType {
        match v {
            None => JsType::Undefined,
            Some(Value::Null) => JsType::Null,
            Some(Value::Number(_)) => JsType::Number,
            Some(Value::Bool(_)) => JsType::Boolean,
            Some(Value::String(_)) => JsType::String,
            Some(Value::Array(_)) => JsType::Array,
            Some(Value::Object(_)) => JsType::Object,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            JsType::Undefined => "undefined",
            JsType::Null => "null",
            JsType::Number => "number",
            JsType::Boolean => "boolean",
            JsType::String => "string",
            JsType::Array => "array",
            JsType::Object => "object",
        }
    }
}

/// The path string from `params.arguments`, or the first issue (§6).
pub fn path_argument(params: &Map<String, Value>) -> Result<&str, ArgumentIssue> {
    let arguments = match params.get("arguments") {
        Some(Value::Object(o)) => o,
        other => return Err(ArgumentIssue::NotAnObject(JsType::of(other))),
    };
    let extra = arguments.keys().any(|k| k != "path");
    match arguments.get("path") {
        Some(Value::String(p)) if !extra => Ok(p),
        Some(Value::String(_)) => Err(ArgumentIssue::ExtraKeys),
        other => Err(ArgumentIssue::Path {
            received: JsType::of(other),
            extra,
        }),
    }
}

/// One zod issue, fields in zod's order.
#[derive(Serialize)]
struct Issue {
    #[serde(skip_serializing_if = "Option::is_none")]
    expected: Option<&'static str>,
    code: &'static str,
    path: Vec<&'static str>,
    message: String,
}

fn invalid_type(expected: &'static str, path: Vec<&'static str>, received: JsType) -> Issue {
    Issue {
        expected: Some(expected),
        code: "invalid_type",
        path,
        message: format!(
            "Invalid input: expected {expected}, received {}",
            received.as_str()
        ),
    }
}

/// The SDK's JSON-RPC error message (-32603) for a `method` call whose `params.task` asks
/// for task-augmented execution, which the gateway does not declare: the tool never
/// runs. `None` when there is no `task`, or when the SDK would ignore it (`method` is not
/// `tools/call` and `task` is not task metadata, `{ttl?: number}`).
pub fn task_refusal(params: &Map<String, Value>, method: &str) -> Option<String> {
    let task = params.get("task")?;
    let issue = match task {
        Value::Object(t) => match t.get("ttl") {
            None | Some(Value::Number(_)) => None,
            other => Some(invalid_type(
                "number",
                vec!["params", "task", "ttl"],
                JsType::of(other),
            )),
        },
        other => Some(invalid_type(
            "object",
            vec!["params", "task"],
            JsType::of(Some(other)),
        )),
    };
    match issue {
        None => Some(format!(
            "Server does not support task creation (required for {method})"
        )),
        // Only `tools/call` params are checked as task-augmented; others drop the key.
        Some(issue) if method == "tools/call" => {
            Some(serde_json::to_string_pretty(&[issue]).unwrap_or_default())
        }
        Some(_) => None,
    }
}

/// Unrecognized keys; the key names are not echoed (the contract only fixes the
/// prefix).
fn unrecognized() -> Issue {
    Issue {
        expected: None,
        code: "unrecognized_keys",
        path: Vec::new(),
        message: "Unrecognized keys: only \"path\" is accepted".to_owned(),
    }
}

impl ArgumentIssue {
    /// The SDK's plain text for `view`'s tool: the prefix and the issue list,
    /// pretty-printed with two spaces as `JSON.stringify(issues, null, 2)` does.
    pub fn text(self, view: View) -> String {
        let issues = match self {
            ArgumentIssue::NotAnObject(t) => vec![invalid_type("object", Vec::new(), t)],
            ArgumentIssue::Path { received, extra } => {
                let mut v = vec![invalid_type("string", vec!["path"], received)];
                if extra {
                    v.push(unrecognized());
                }
                v
            }
            ArgumentIssue::ExtraKeys => vec![unrecognized()],
        };
        let list = serde_json::to_string_pretty(&issues).unwrap_or_else(|_| "[]".to_owned());
        format!("{ARGUMENT_PREFIX}{}: {list}", tool_name(view))
    }
}

#[derive(Serialize)]
struct TextContent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct ToolResult<'a> {
    content: [TextContent<'a>; 1],
    #[serde(rename = "isError", skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
}

fn result_json(text: &str, is_error: bool) -> String {
    let r = ToolResult {
        content: [TextContent { kind: "text", text }],
        is_error: is_error.then_some(true),
    };
    // Serializing two strings and a bool cannot fail.
    serde_json::to_string(&r).unwrap_or_default()
}

/// The success result: the view's compact JSON as text, no `isError` key. What
/// `serde_json` writes for [`ToolResult`], written into a buffer of the exact length: the
/// text may be megabytes, and serializing would grow a buffer to twice that.
pub fn success(document_json: &str) -> String {
    const OPEN: &str = r#"{"content":[{"type":"text","text":"#;
    const CLOSE: &str = "}]}";
    let mut out = String::with_capacity(
        OPEN.len() + crate::extract::json::str_len(document_json) + CLOSE.len(),
    );
    out.push_str(OPEN);
    crate::extract::json::push_str(&mut out, document_json);
    out.push_str(CLOSE);
    out
}

impl ToolFailure {
    /// The `isError: true` result of `view`'s tool.
    pub fn result(self, view: View) -> String {
        let text = match self {
            ToolFailure::Denied => format!("MCP error -32602: Tool {} not found", tool_name(view)),
            ToolFailure::Arguments(issue) => issue.text(view),
            ToolFailure::InvalidPath => envelope("Invalid path"),
            // The only variable text: a number, so nothing from upstream is echoed.
            ToolFailure::Upstream(status) => envelope(&format!("Upstream {status}")),
            ToolFailure::Runtime => envelope("Runtime failure"),
        };
        result_json(&text, true)
    }
}

fn envelope(message: &str) -> String {
    format!(r#"{{"error":"{message}","code":"UPSTREAM_ERROR"}}"#)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::mcp::wire::TOOL_NAME;
    use serde_json::json;

    const PREFIX: &str =
        "MCP error -32602: Input validation error: Invalid arguments for tool get_section_source: ";

    fn issue(args: Value) -> String {
        let params = json!({"name": TOOL_NAME, "arguments": args});
        path_argument(params.as_object().unwrap())
            .unwrap_err()
            .text(View::SectionSource)
    }

    #[test]
    fn success_is_what_serde_writes_in_a_buffer_of_its_length() {
        for text in ["", "{\"a\":\"b\\\\c\"}", "\u{1}\n\t\u{7f}é🦀", "x\u{2028}y"] {
            let s = success(text);
            assert_eq!(s, result_json(text, false));
            assert_eq!(s.capacity(), s.len());
        }
    }

    #[test]
    fn a_task_request_is_refused_as_the_sdk_refuses_it() {
        let refusal =
            |params: Value, method: &str| task_refusal(params.as_object().unwrap(), method);
        let call = "Server does not support task creation (required for tools/call)";
        assert_eq!(
            refusal(json!({"task": {"ttl": 5}}), "tools/call").as_deref(),
            Some(call)
        );
        assert_eq!(
            refusal(json!({"task": {"x": 1}}), "tools/call").as_deref(),
            Some(call)
        );
        assert_eq!(refusal(json!({"name": "x"}), "tools/call"), None);
        // Texts as SDK 1.27.1 with zod 4.3.6 prints them.
        assert_eq!(
            refusal(json!({"task": "s"}), "tools/call").as_deref(),
            Some("[\n  {\n    \"expected\": \"object\",\n    \"code\": \"invalid_type\",\n    \"path\": [\n      \"params\",\n      \"task\"\n    ],\n    \"message\": \"Invalid input: expected object, received string\"\n  }\n]")
        );
        assert_eq!(
            refusal(json!({"task": {"ttl": null}}), "tools/call").as_deref(),
            Some("[\n  {\n    \"expected\": \"number\",\n    \"code\": \"invalid_type\",\n    \"path\": [\n      \"params\",\n      \"task\",\n      \"ttl\"\n    ],\n    \"message\": \"Invalid input: expected number, received null\"\n  }\n]")
        );
        // Other methods only refuse task metadata; anything else is dropped.
        assert_eq!(
            refusal(json!({"task": {}}), "resources/read").as_deref(),
            Some("Server does not support task creation (required for resources/read)")
        );
        assert_eq!(refusal(json!({"task": 5}), "resources/read"), None);
    }

    #[test]
    fn s6_argument_errors_match_the_sdk_text() {
        assert_eq!(
            issue(json!({})),
            format!("{PREFIX}[\n  {{\n    \"expected\": \"string\",\n    \"code\": \"invalid_type\",\n    \"path\": [\n      \"path\"\n    ],\n    \"message\": \"Invalid input: expected string, received undefined\"\n  }}\n]")
        );
        assert!(issue(json!({"path": null})).ends_with("received null\"\n  }\n]"));
        assert!(issue(json!({"path": 1})).contains("received number"));
        assert!(issue(json!({"path": [1]})).contains("received array"));
        assert!(issue(json!({"path": {}})).contains("received object"));
        assert!(issue(json!({"path": true})).contains("received boolean"));
        let absent = path_argument(json!({"name": TOOL_NAME}).as_object().unwrap())
            .unwrap_err()
            .text(View::SectionSource);
        assert_eq!(
            absent,
            format!("{PREFIX}[\n  {{\n    \"expected\": \"object\",\n    \"code\": \"invalid_type\",\n    \"path\": [],\n    \"message\": \"Invalid input: expected object, received undefined\"\n  }}\n]")
        );
        assert!(issue(json!({"path": "a.md", "x": 1})).contains("unrecognized_keys"));
        assert!(!issue(json!({"path": "a.md", "secretkey": 1})).contains("secretkey"));
    }

    #[test]
    fn s6_results_have_the_sdk_shape() {
        assert_eq!(
            success("{\"a\":1}"),
            r#"{"content":[{"type":"text","text":"{\"a\":1}"}]}"#
        );
        assert_eq!(
            ToolFailure::Upstream(404).result(View::SectionSource),
            r#"{"content":[{"type":"text","text":"{\"error\":\"Upstream 404\",\"code\":\"UPSTREAM_ERROR\"}"}],"isError":true}"#
        );
        assert_eq!(
            ToolFailure::Denied.result(View::SectionSource),
            r#"{"content":[{"type":"text","text":"MCP error -32602: Tool get_section_source not found"}],"isError":true}"#
        );
        assert_eq!(
            ToolFailure::Denied.result(View::NoteOutline),
            r#"{"content":[{"type":"text","text":"MCP error -32602: Tool get_note_outline not found"}],"isError":true}"#
        );
        assert!(ArgumentIssue::ExtraKeys
            .text(View::DocumentTree)
            .starts_with("MCP error -32602: Input validation error: Invalid arguments for tool get_document_tree: ["));
    }
}
