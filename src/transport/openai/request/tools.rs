//! The request's tools, its tool choice and its response format, in OpenAI's shapes:
//! decoded into the gateway's types, each error naming its field (`tools[2].function.name`).

use serde::Deserialize;
use serde_json::Value;

use crate::transport::decode_error::{DecodeError, PathStyle};
use crate::types::{ResponseFormat, ToolChoice, ToolSpec};

#[derive(Debug, Deserialize)]
struct RawTool {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    function: Option<RawFunction>,
}

#[derive(Debug, Deserialize)]
struct RawFunction {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

pub(super) fn tool(i: usize, value: Value) -> Result<ToolSpec, DecodeError> {
    let at = format!("tools[{i}]");
    let raw: RawTool = DecodeError::decode_at(&value, &at, PathStyle::Brackets)?;
    if let Some(kind) = raw.kind.as_deref().filter(|k| *k != "function") {
        return Err(DecodeError::new(
            at.clone(),
            format!("{at}: tool type {kind:?} is not supported"),
        ));
    }
    let function = raw
        .function
        .ok_or_else(|| DecodeError::new(format!("{at}.function"), format!("{at} has no 'function'")))?;
    if function.name.is_empty() {
        return Err(DecodeError::new(
            format!("{at}.function.name"),
            format!("{at} has an empty name"),
        ));
    }
    Ok(ToolSpec {
        name: function.name,
        description: function.description,
        parameters: function.parameters.unwrap_or_else(empty_object_schema),
    })
}

pub(crate) fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// `None` for an explicit `null`.
pub(super) fn tool_choice(value: Value, tools: &[ToolSpec]) -> Result<Option<ToolChoice>, DecodeError> {
    let choice = match &value {
        Value::Null => return Ok(None),
        Value::String(s) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(DecodeError::new(
                    "tool_choice",
                    format!("tool_choice must be \"auto\", \"none\", \"required\" or a function, not {other:?}"),
                ))
            }
        },
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => {
            let name = obj.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            ToolChoice::Tool(
                name.ok_or_else(|| DecodeError::new("tool_choice", "tool_choice.function.name is required"))?
                    .to_string(),
            )
        }
        _ => return Err(DecodeError::new(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":…}}",
        )),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(DecodeError::new(
            "tool_choice",
            "tool_choice \"required\" needs at least one tool in 'tools'",
        )),
        ToolChoice::Tool(name) if !tools.iter().any(|t| &t.name == name) => Err(DecodeError::new(
            "tool_choice",
            format!("tool_choice names function {name:?}, which is not in 'tools'"),
        )),
        _ => Ok(Some(choice)),
    }
}

/// `None` for an explicit `null`.
pub(super) fn response_format(value: Value) -> Result<Option<ResponseFormat>, DecodeError> {
    if value.is_null() {
        return Ok(None);
    }
    let kind = value.get("type").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "text" => Ok(Some(ResponseFormat::Text)),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => {
            let spec = value.get("json_schema").ok_or_else(|| {
                DecodeError::new(
                    "response_format.json_schema",
                    "response_format of type json_schema needs 'json_schema'",
                )
            })?;
            let schema = spec.get("schema").cloned().ok_or_else(|| {
                DecodeError::new(
                    "response_format.json_schema.schema",
                    "response_format.json_schema.schema is required",
                )
            })?;
            Ok(Some(ResponseFormat::JsonSchema {
                name: spec
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("response")
                    .to_string(),
                schema,
                strict: spec.get("strict").and_then(Value::as_bool),
            }))
        }
        other => Err(DecodeError::new(
            "response_format.type",
            format!("response_format.type must be text, json_object or json_schema, not {other:?}"),
        )),
    }
}
