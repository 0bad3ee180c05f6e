//! The gateway's one error type and its mapping to HTTP: every failure is classified once (by
//! validation, admission or the backend) and turned into a status code and an OpenAI-shaped body
//! `{"error": {"message", "type", "param", "code"}}` here, at the edge.

use serde::Serialize;
use warp::http::StatusCode;

/// A request that cannot be (or could not be) served, with enough detail for the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON.
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// A field is missing, has the wrong type or an out-of-range value.
    #[error("{message}")]
    InvalidField {
        /// The field, as a JSON path (`temperature`, `messages[1].content`).
        param: String,
        message: String,
    },
    /// Something else about the request is invalid.
    #[error("{0}")]
    InvalidRequest(String),
    /// The prompt plus the requested output does not fit the model's context.
    #[error("this model's maximum context length is {max_model_len} tokens, but {requested} tokens were requested ({prompt_tokens} in the prompt, {max_tokens} for the completion); reduce the prompt or max_tokens")]
    ContextLength {
        /// The field holding the prompt (`messages` or `prompt`).
        param: &'static str,
        max_model_len: usize,
        prompt_tokens: usize,
        max_tokens: usize,
        requested: usize,
    },
    /// The request names a model this server does not serve.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// The request body exceeds the gateway's limit.
    #[error("the request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The request body did not arrive in time.
    #[error("the request body did not arrive within {0} s")]
    BodyTimeout(u64),
    /// A POST body declared as something other than JSON (a browser's cross-site form or
    /// `text/plain` request is never executed).
    #[error("the request body must be JSON (Content-Type: application/json), not {0}")]
    UnsupportedMediaType(String),
    /// A `/v1/*` request without the server's API key.
    #[error("incorrect or missing API key: send it as `Authorization: Bearer <key>`")]
    Unauthorized,
    /// No route for this path.
    #[error("no route for {0}")]
    NotFound(String),
    /// The path exists but not for this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Too many requests in flight; retry after the given number of seconds.
    #[error("the server is at its limit of {limit} concurrent requests; retry later")]
    TooManyRequests { limit: usize, retry_after_s: u32 },
    /// The backend cannot take more work right now.
    #[error("the server is overloaded: {0}")]
    Overloaded(String),
    /// A failure inside the server.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The message of every internal error a client sees.
pub const INTERNAL_PUBLIC: &str = "the server failed while serving this request; its log has the details";

/// The JSON body of an error response (and of an error event inside a stream).
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

/// `error` inside [`ErrorBody`].
#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub param: Option<&'a str>,
    pub code: Option<&'a str>,
}

impl ApiError {
    /// Shorthand for [`ApiError::InvalidField`].
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField { param: param.into(), message: message.into() }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::InvalidField { .. }
            | ApiError::InvalidRequest(_)
            | ApiError::ContextLength { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's `error.code`.
    pub fn code(&self) -> Option<&'static str> {
        Some(match self {
            ApiError::MalformedJson(_) => "invalid_json",
            ApiError::InvalidField { .. } => "invalid_value",
            ApiError::InvalidRequest(_) => return None,
            ApiError::ContextLength { .. } => "context_length_exceeded",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::BodyTimeout(_) => "request_timeout",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::TooManyRequests { .. } => "rate_limit_exceeded",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Internal(_) => "internal_error",
        })
    }

    /// OpenAI's `error.param`: the offending field, when there is one.
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidField { param, .. } => Some(param),
            ApiError::ContextLength { param, .. } => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// `Retry-After` seconds for overload answers.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            ApiError::TooManyRequests { retry_after_s, .. } => Some(*retry_after_s),
            ApiError::Overloaded(_) => Some(1),
            _ => None,
        }
    }

    /// What the client is told: an internal failure's detail (rank, transfer, device messages)
    /// stays in the server's log, where the gateway writes it with the request id.
    pub fn public_message(&self) -> String {
        match self {
            ApiError::Internal(_) => INTERNAL_PUBLIC.to_string(),
            other => other.to_string(),
        }
    }

    /// The OpenAI error body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: self.public_message(),
                kind: self.kind(),
                param: self.param(),
                code: self.code(),
            },
        }
    }

    /// The body serialized to JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.into()
        })
    }

    /// The complete HTTP response.
    pub fn into_response(self) -> warp::reply::Response {
        let mut res = warp::http::Response::builder().status(self.status()).header("content-type", "application/json");
        if let Some(s) = self.retry_after() {
            res = res.header("retry-after", s.to_string());
        }
        let body = bytes::Bytes::from(self.to_json());
        res.body(body.into()).unwrap_or_else(|_| warp::reply::Response::new(bytes::Bytes::new().into()))
    }
}

impl From<cleave_engine::EngineError> for ApiError {
    /// Tokenizer and template failures are problems with the request (a template that raises on
    /// the conversation, bad `chat_template_kwargs`); everything else is internal.
    fn from(e: cleave_engine::EngineError) -> Self {
        use cleave_engine::EngineError as E;
        match e {
            E::InvalidRequest(m) => ApiError::InvalidRequest(m),
            E::Tokenizer(m) => ApiError::InvalidRequest(m),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// How a JSON value is named in error messages ("a string", "an object").
pub(crate) fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_openai_shaped_with_status_and_code() {
        let e = ApiError::ContextLength {
            param: "messages",
            max_model_len: 10,
            prompt_tokens: 8,
            max_tokens: 5,
            requested: 13,
        };
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("10 tokens"));
        let e = ApiError::field("temperature", "`temperature` must be >= 0");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(ApiError::ModelNotFound("x".into()).status(), StatusCode::NOT_FOUND);
        assert_eq!(ApiError::PayloadTooLarge { limit: 1 }.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let e = ApiError::TooManyRequests { limit: 2, retry_after_s: 1 };
        assert_eq!((e.status(), e.retry_after()), (StatusCode::TOO_MANY_REQUESTS, Some(1)));
        let keys: Vec<String> = v["error"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 4);
    }
}
