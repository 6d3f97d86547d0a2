//! Documents in a request: Anthropic `document` content blocks and OpenAI `file` content
//! parts, accepted in their real forms and refused, with the real message, when malformed.
//!
//! Anthropic (providers.md §2.5): a `document` takes a `source` of type `base64` (media type
//! `application/pdf`, data a base64 PDF), `text` (`media_type: "text/plain"`, `data`), `url`
//! (`url`), `content` (`content`), or `file` (`file_id`, with the `files-api-2025-04-14`
//! beta). Sources of the messages: "…document.source: Input tag 'file' found using 'type'
//! does not match any of the expected tags: 'base64', 'content', 'text', 'url'",
//! "…document.source.base64.media_type: Input should be 'application/pdf'" and
//! "messages.0.content.0.pdf.source.base64.data: The PDF specified was not valid." as the API
//! returned them to clients; "Field required" and "Unable to extract tag using discriminator
//! 'type'" are the same schema validator's wording for a missing field or tag.
//!
//! OpenAI: a `file` part is `{"type":"file","file":{"file_data":"data:application/pdf;base64,
//! …","filename":…}}` or `{"file":{"file_id":…}}`. A `file_data` of another MIME type gets
//! OpenAI's "Invalid file data: 'messages[1].content[1].file.file_data'. Expected a
//! base64-encoded data URL with an application/pdf MIME type (e.g.
//! 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got unsupported MIME type
//! 'text/plain'."; the same sentence ends differently for a value that is no data URL or
//! holds no valid base64, and a part with no file at all gets "Missing required parameter"
//! (*[unverified]* endings, after OpenAI's patterns).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::Value;

use super::super::plan::StatusError;
use super::has_beta;

const FILES_BETA: &str = "files-api-2025-04-14";

/// The source tags the Messages API takes without the Files API beta.
const SOURCE_TAGS: &str = "'base64', 'content', 'text', 'url'";

/// Every `document` block of every message, checked.
pub(super) fn anthropic(body: &Value, beta: Option<&str>) -> Option<StatusError> {
    for (n, message) in messages(body) {
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (m, block) in blocks.iter().enumerate() {
            if block.get("type").and_then(Value::as_str) == Some("document") {
                let at = format!("messages.{n}.content.{m}");
                if let Some(message) = document(&at, block, beta) {
                    return Some(StatusError::invalid(message));
                }
            }
        }
    }
    None
}

fn document(at: &str, block: &Value, beta: Option<&str>) -> Option<String> {
    let Some(source) = block.get("source").filter(|s| s.is_object()) else {
        return Some(format!("{at}.document.source: Field required"));
    };
    let field = |key: &str| source.get(key).and_then(Value::as_str);
    let required = |tag: &str, key: &str| {
        field(key)
            .is_none()
            .then(|| format!("{at}.document.source.{tag}.{key}: Field required"))
    };
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            if let Some(missing) = required("base64", "media_type").or_else(|| required("base64", "data")) {
                return Some(missing);
            }
            if field("media_type") != Some("application/pdf") {
                return Some(format!(
                    "{at}.document.source.base64.media_type: Input should be 'application/pdf'"
                ));
            }
            let pdf = field("data")
                .and_then(|data| STANDARD.decode(data).ok())
                .is_some_and(|bytes| bytes.starts_with(b"%PDF-"));
            (!pdf).then(|| format!("{at}.pdf.source.base64.data: The PDF specified was not valid."))
        }
        Some("text") => {
            if let Some(missing) = required("text", "media_type").or_else(|| required("text", "data")) {
                return Some(missing);
            }
            (field("media_type") != Some("text/plain"))
                .then(|| format!("{at}.document.source.text.media_type: Input should be 'text/plain'"))
        }
        Some("url") => required("url", "url"),
        Some("content") => source
            .get("content")
            .is_none()
            .then(|| format!("{at}.document.source.content.content: Field required")),
        Some("file") if has_beta(beta, FILES_BETA) => required("file", "file_id"),
        Some(tag) => Some(format!(
            "{at}.document.source: Input tag '{tag}' found using 'type' does not match any of the expected tags: {SOURCE_TAGS}"
        )),
        None => Some(format!(
            "{at}.document.source: Unable to extract tag using discriminator 'type'"
        )),
    }
}

/// Every `file` part of every message, checked.
pub(super) fn openai(body: &Value) -> Option<StatusError> {
    for (n, message) in messages(body) {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (m, part) in parts.iter().enumerate() {
            if part.get("type").and_then(Value::as_str) == Some("file") {
                if let Some(error) = file(&format!("messages[{n}].content[{m}].file"), part) {
                    return Some(error);
                }
            }
        }
    }
    None
}

fn file(at: &str, part: &Value) -> Option<StatusError> {
    let missing = |param: String| {
        let message = format!("Missing required parameter: '{param}'.");
        Some(StatusError::invalid(message).at(param, "missing_required_parameter"))
    };
    let Some(file) = part.get("file").filter(|f| f.is_object()) else {
        return missing(at.to_owned());
    };
    if file.get("file_id").and_then(Value::as_str).is_some() {
        return None;
    }
    let Some(data) = file.get("file_data").and_then(Value::as_str) else {
        return missing(format!("{at}.file_id"));
    };
    let param = format!("{at}.file_data");
    let got = match data.strip_prefix("data:").and_then(|rest| rest.split_once(',')) {
        None => "a value that is not a data URL".to_owned(),
        Some((header, payload)) => match header.strip_suffix(";base64") {
            Some("application/pdf") if STANDARD.decode(payload).is_ok() => return None,
            Some("application/pdf") => "data that is not valid base64".to_owned(),
            Some(mime) => format!("unsupported MIME type '{mime}'"),
            None => "a data URL that is not base64-encoded".to_owned(),
        },
    };
    let message = format!(
        "Invalid file data: '{param}'. Expected a base64-encoded data URL with an application/pdf MIME type \
         (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got {got}."
    );
    Some(StatusError::invalid(message).at(param, "invalid_value"))
}

fn messages(body: &Value) -> impl Iterator<Item = (usize, &Value)> {
    body.get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// "%PDF-1.7 …" in base64.
    const PDF: &str = "JVBERi0xLjcKJSBzaW0=";

    fn anthropic_with(source: Value, beta: Option<&str>) -> Option<String> {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "summarise"},
            {"type": "document", "source": source}
        ]}]});
        anthropic(&body, beta).and_then(|e| e.message)
    }

    #[test]
    fn anthropic_takes_the_real_document_sources() {
        for source in [
            json!({"type": "base64", "media_type": "application/pdf", "data": PDF}),
            json!({"type": "text", "media_type": "text/plain", "data": "plain words"}),
            json!({"type": "url", "url": "https://example.com/a.pdf"}),
            json!({"type": "content", "content": [{"type": "text", "text": "a"}]}),
        ] {
            assert_eq!(anthropic_with(source.clone(), None), None, "{source}");
        }
        let file = json!({"type": "file", "file_id": "file_011"});
        assert_eq!(
            anthropic_with(file, Some("files-api-2025-04-14")),
            None,
            "with the beta"
        );
    }

    #[test]
    fn anthropic_refuses_a_malformed_document_in_its_words() {
        let body = json!({"messages": [{"role": "user", "content": [{"type": "document"}]}]});
        assert_eq!(
            anthropic(&body, None).and_then(|e| e.message).as_deref(),
            Some("messages.0.content.0.document.source: Field required")
        );
        let cases = [
            (
                json!({"type": "file", "file_id": "file_011"}),
                "messages.0.content.1.document.source: Input tag 'file' found using 'type' does not match any of the expected tags: 'base64', 'content', 'text', 'url'",
            ),
            (
                json!({"url": "https://example.com"}),
                "messages.0.content.1.document.source: Unable to extract tag using discriminator 'type'",
            ),
            (
                json!({"type": "base64", "media_type": "text/plain", "data": PDF}),
                "messages.0.content.1.document.source.base64.media_type: Input should be 'application/pdf'",
            ),
            (
                json!({"type": "base64", "media_type": "application/pdf", "data": "not base64!"}),
                "messages.0.content.1.pdf.source.base64.data: The PDF specified was not valid.",
            ),
            (
                json!({"type": "base64", "media_type": "application/pdf", "data": "SGVsbG8="}),
                "messages.0.content.1.pdf.source.base64.data: The PDF specified was not valid.",
            ),
            (
                json!({"type": "base64", "media_type": "application/pdf"}),
                "messages.0.content.1.document.source.base64.data: Field required",
            ),
            (json!({"type": "url"}), "messages.0.content.1.document.source.url.url: Field required"),
        ];
        for (source, want) in cases {
            assert_eq!(anthropic_with(source.clone(), None).as_deref(), Some(want), "{source}");
        }
    }

    fn openai_with(part: Value) -> Option<StatusError> {
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "summarise"}, part]}
        ]});
        openai(&body)
    }

    #[test]
    fn openai_takes_a_pdf_data_url_or_a_file_id_and_refuses_the_rest() {
        let data = format!("data:application/pdf;base64,{PDF}");
        for part in [
            json!({"type": "file", "file": {"file_data": data, "filename": "a.pdf"}}),
            json!({"type": "file", "file": {"file_id": "file-abc"}}),
        ] {
            assert!(openai_with(part.clone()).is_none(), "{part}");
        }
        let text = json!({"type": "file", "file": {"file_data": "data:text/plain;base64,SGk=", "filename": "a.txt"}});
        let error = openai_with(text).unwrap_or_else(|| panic!("refused"));
        assert_eq!(
            error.message.as_deref(),
            Some(
                "Invalid file data: 'messages[1].content[1].file.file_data'. Expected a base64-encoded data URL with \
                 an application/pdf MIME type (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got \
                 unsupported MIME type 'text/plain'."
            )
        );
        assert_eq!(error.param.as_deref(), Some("messages[1].content[1].file.file_data"));
        let broken = json!({"type": "file", "file": {"file_data": "data:application/pdf;base64,%%%"}});
        let message = openai_with(broken).and_then(|e| e.message).unwrap_or_default();
        assert!(message.ends_with("but got data that is not valid base64."), "{message}");
        let missing = openai_with(json!({"type": "file"})).unwrap_or_else(|| panic!("refused"));
        assert_eq!(
            missing.message.as_deref(),
            Some("Missing required parameter: 'messages[1].content[1].file'.")
        );
        assert_eq!(missing.code, Some("missing_required_parameter"));
        let empty = openai_with(json!({"type": "file", "file": {"filename": "a.pdf"}}));
        assert_eq!(
            empty.and_then(|e| e.param).as_deref(),
            Some("messages[1].content[1].file.file_id")
        );
    }
}
