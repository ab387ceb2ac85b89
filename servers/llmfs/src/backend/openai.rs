//! The OpenAI-compatible chat-completions API (`POST {url}/v1/chat/completions`): the request
//! body from a conversation (already in its message shape), its server-sent event stream and its
//! whole (non-streamed) reply.

use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

use super::{
    AskError, AskRequest, Event, Reply, SseResult, ToolCall, Usage, count, error_message,
    finish_calls, malformed, parse_data, quote,
};

pub(super) fn openai_body(req: &AskRequest) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(req.messages.iter().cloned());
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.clone());
    }
    if let Some(n) = req.max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

pub(super) async fn openai_stream<E: std::fmt::Display>(
    events: impl Stream<Item = SseResult<E>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Reply, AskError> {
    let mut events = std::pin::pin!(events);
    let mut reply = Reply::default();
    // Tool calls by their index, filled in as their pieces arrive.
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut done = false;
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| AskError::BrokenOff(e.to_string()))?;
        if ev.data.trim() == "[DONE]" {
            done = true;
            break;
        }
        if ev.data.trim().is_empty() {
            continue;
        }
        let chunk = parse_data(&ev.data)?;
        if let Some(e) = chunk.get("error") {
            return Err(AskError::Reported(error_message(
                &serde_json::to_vec(&json!({"error": e})).unwrap_or_default(),
            )));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            reply.usage = Usage {
                prompt_tokens: count(&u["prompt_tokens"]),
                completion_tokens: count(&u["completion_tokens"]),
            };
        }
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return Err(malformed(format!(
                "a chunk without `choices`: {}",
                quote(&ev.data)
            )));
        };
        let Some(choice) = choices.first() else {
            continue; // the usage chunk
        };
        let delta = &choice["delta"];
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            reply.text.push_str(text);
            on_event(Event::Text(text.to_owned()));
        }
        for piece in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = piece
                .get("index")
                .and_then(Value::as_u64)
                .map_or(calls.len().saturating_sub(1), |i| i as usize);
            if index > calls.len() + 64 {
                return Err(malformed(format!("tool call index {index}")));
            }
            if calls.len() <= index {
                calls.resize_with(index + 1, ToolCall::default);
            }
            let call = &mut calls[index];
            if let Some(id) = piece.get("id").and_then(Value::as_str) {
                call.id = id.to_owned();
            }
            let f = &piece["function"];
            if let Some(name) = f.get("name").and_then(Value::as_str) {
                call.name.push_str(name);
            }
            if let Some(args) = f.get("arguments").and_then(Value::as_str) {
                call.arguments.push_str(args);
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            reply.finish_reason = Some(reason.to_owned());
        }
    }
    if !done && reply.finish_reason.is_none() {
        return Err(AskError::BrokenOff(
            "the stream ended before the reply was complete".into(),
        ));
    }
    finish_calls(&mut reply, calls, on_event)?;
    Ok(reply)
}

pub(super) fn openai_whole(v: &Value) -> Result<Reply, AskError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("a completion without `choices`"))?;
    let message = &choice["message"];
    let mut reply = Reply {
        text: message["content"].as_str().unwrap_or_default().to_owned(),
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
        usage: Usage {
            prompt_tokens: count(&v["usage"]["prompt_tokens"]),
            completion_tokens: count(&v["usage"]["completion_tokens"]),
        },
        ..Reply::default()
    };
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| ToolCall {
            id: c["id"].as_str().unwrap_or_default().to_owned(),
            name: c["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            arguments: c["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        })
        .collect();
    finish_calls(&mut reply, calls, &mut |_| {})?;
    Ok(reply)
}
